"""Run a scenario: build workload, replicas and gateway, apply the deploy and the changes, measure.

:func:`run_scenario` is the one entry point the CLI, the demo and the tests
use. The measurement here reads the simulator's own records (the same
numbers the spans carry) so that a scenario's claimed regression can be
checked without a store; the round-trip tests check that the telemetry
carries them faithfully.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from sre_agent.errors import ScenarioError
from sre_agent.replays.costmodel import PROFILES
from sre_agent.replays.engine import Replica
from sre_agent.replays.gateway import Fault, GatewayConfig, LatencyDist, RequestRecord, Simulation, TelemetrySink
from sre_agent.replays.outputs import TelemetryOutput
from sre_agent.replays.scenario import Change, Scenario
from sre_agent.replays.stats import Histogram as EngineHistogram
from sre_agent.replays.telemetry import TelemetryEmitter
from sre_agent.replays.workload import (
    MixShift,
    RateChange,
    TraceRow,
    WorkloadRequest,
    build_workload,
    load_trace,
    synthetic_rows,
)

__all__ = ["ReplayResult", "build_workload_for", "epoch_ns", "quantile", "replay", "run_scenario"]

_ENGINE_METRICS = ("engine_e2e", "ttft", "tpot", "queue", "prefill", "decode")


def epoch_ns(scenario: Scenario) -> int:
    """Unix time in ns of the replay's time 0 (``start_time`` of the scenario)."""
    try:
        dt = datetime.fromisoformat(scenario.start_time.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ScenarioError(f"{scenario.path}: start_time {scenario.start_time!r} is not ISO 8601") from exc
    return int(dt.timestamp()) * 1_000_000_000


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of ``values`` (numpy's default); NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _params(change: Change, scenario: Scenario, allowed: tuple[str, ...]) -> dict[str, object]:
    for key in change.params:
        if key not in allowed:
            raise ScenarioError(f"{scenario.path}: change {change.kind!r} has unknown key {key!r} (allowed: {allowed})")
    return dict(change.params)


def build_workload_for(scenario: Scenario) -> list[WorkloadRequest]:
    """The scenario's requests, traffic changes (rate, mix, template) applied."""
    spec = scenario.workload
    rows: Sequence[TraceRow]
    if spec.trace == "synthetic":
        rows = synthetic_rows(
            spec.rate_per_s,
            spec.duration_s * 2,
            scenario.seed,
            input_mean=spec.input_mean,
            output_mean=spec.output_mean,
        )
    else:
        rows = load_trace(spec.trace)
    rate_changes: list[RateChange] = []
    mix_shifts: list[MixShift] = []
    template_at: float | None = None
    for change in scenario.changes:
        if change.kind == "rate":
            p = _params(change, scenario, ("multiplier",))
            rate_changes.append(RateChange(change.at_s, float(p["multiplier"])))  # type: ignore[arg-type]
        elif change.kind == "mix":
            p = _params(change, scenario, ("weights",))
            weights = p["weights"]
            if not isinstance(weights, dict):
                raise ScenarioError(f"{scenario.path}: mix change needs a weights table")
            mix_shifts.append(MixShift(change.at_s, {str(k): float(v) for k, v in weights.items()}))
        elif change.kind == "template_break":
            _params(change, scenario, ())
            template_at = change.at_s
    return build_workload(
        rows,
        duration_s=spec.duration_s,
        tenants=spec.tenants,
        routes=scenario.routes,
        seed=scenario.seed,
        start_s=spec.start_s,
        rate_scale=spec.rate_scale,
        loop_s=spec.loop_s,
        rate_changes=rate_changes,
        mix_shifts=mix_shifts,
        template_breaks_at_s=template_at,
    )


def _runtime_changes(scenario: Scenario) -> tuple[list[tuple[float, Callable[[Simulation], None]]], list[Fault]]:
    events: list[tuple[float, Callable[[Simulation], None]]] = []
    faults: list[Fault] = []
    deploy = scenario.deploy
    after = scenario.engine_after

    def do_deploy(sim: Simulation) -> None:
        if deploy.service == "vllm":
            sim.deploy_engine(deploy.replicas, after, deploy.new_version)
        else:
            sim.gateway.version = deploy.new_version
            if deploy.retry is not None:
                sim.gateway.retry = deploy.retry
            if deploy.routing is not None:
                sim.gateway.routing = deploy.routing
            if after != scenario.engine_before:
                for r in sim.replicas:
                    if deploy.replicas is None or r.name in deploy.replicas:
                        r.reconfigure(after, r.version)

    events.append((deploy.at_s, do_deploy))
    for change in scenario.changes:
        if change.kind == "dependency":
            p = _params(change, scenario, ("dependency", "tenant", "median_s", "sigma"))
            key = (str(p["dependency"]), str(p["tenant"]) if "tenant" in p else None)
            dist = LatencyDist(float(p["median_s"]), float(p.get("sigma", 0.3)))  # type: ignore[arg-type]

            def set_dep(sim: Simulation, key: tuple[str, str | None] = key, dist: LatencyDist = dist) -> None:
                sim.dependency_overrides[key] = dist

            events.append((change.at_s, set_dep))
        elif change.kind == "remove_replica":
            p = _params(change, scenario, ("replica",))

            def remove(sim: Simulation, name: str = str(p["replica"])) -> None:
                sim.replica(name).routable = False

            events.append((change.at_s, remove))
        elif change.kind == "fault":
            p = _params(change, scenario, ("error_rate", "status", "replica", "end_s"))
            faults.append(
                Fault(
                    error_rate=float(p["error_rate"]),  # type: ignore[arg-type]
                    status=int(p.get("status", 500)),  # type: ignore[call-overload]
                    replica=str(p["replica"]) if "replica" in p else None,
                    start_s=change.at_s,
                    end_s=float(p.get("end_s", float("inf"))),  # type: ignore[arg-type]
                )
            )
        elif change.kind == "retry":
            p = _params(change, scenario, ("max_attempts", "attempt_timeout_s"))

            def set_retry(sim: Simulation, p: dict[str, object] = p) -> None:
                sim.gateway.retry = replace(sim.gateway.retry, **p)  # type: ignore[arg-type]

            events.append((change.at_s, set_retry))
        elif change.kind == "rollout":
            events.extend(_rollout(change, scenario))
    return events, faults


def _rollout(change: Change, scenario: Scenario) -> list[tuple[float, Callable[[Simulation], None]]]:
    """One step of a rolling restart: the replica leaves the pool for ``down_s``, then serves the new version.

    A restarted process starts with an empty prefix cache (``cold_cache``, default true); requests
    already running on it finish first (a graceful drain), new ones go elsewhere meanwhile.
    """
    p = _params(change, scenario, ("replica", "down_s", "cold_cache"))
    name = str(p["replica"])
    down_s = float(p.get("down_s", 0.0))  # type: ignore[arg-type]
    cold = bool(p.get("cold_cache", True))

    def leave(sim: Simulation) -> None:
        sim.replica(name).routable = False

    def back(sim: Simulation) -> None:
        replica = sim.replica(name)
        replica.reconfigure(scenario.engine_after, scenario.deploy.new_version)
        if cold:
            replica.pool.set_caching(False)
            replica.pool.set_caching(scenario.engine_after.enable_prefix_caching)
        replica.routable = True

    return [(change.at_s, leave), (change.at_s + down_s, back)]


@dataclass
class ReplayResult:
    """A finished replay: every logical request, the replicas' final state, and timings.

    Attributes:
        wall_s: wall-clock seconds the replay took (telemetry included).
        sim_s: simulated seconds of traffic (the workload's duration).
    """

    scenario: Scenario
    records: list[RequestRecord]
    replicas: list[Replica]
    wall_s: float
    sim_s: float
    started: float = 0.0
    itl_at_deploy: dict[str, EngineHistogram] = field(default_factory=dict)

    def windows(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """Baseline and candidate windows of equal length around the deploy, seconds."""
        at = self.scenario.deploy.at_s
        width = min(at, self.sim_s - at)
        return (at - width, at), (at, at + width)

    def _select(self, lo: float, hi: float, scope: dict[str, str]) -> list[RequestRecord]:
        out = []
        for rec in self.records:
            if not lo <= rec.start_s < hi:
                continue
            if "tenant.id" in scope and rec.req.tenant != scope["tenant.id"]:
                continue
            if "http.route" in scope and rec.req.route != scope["http.route"]:
                continue
            if "host.name" in scope and (not rec.attempts or rec.attempts[-1].replica != scope["host.name"]):
                continue
            out.append(rec)
        return out

    @staticmethod
    def _values(records: list[RequestRecord], stage: str) -> list[float]:
        if stage == "e2e":
            return [r.end_s - r.start_s for r in records if r.status == "ok"]
        if stage == "dependency":
            return [sum(d.end_s - d.start_s for d in r.deps) for r in records if r.deps]
        out = []
        for r in records:
            spans = r.engine_spans
            if not spans or spans[-1].seq is None:
                continue
            s = spans[-1].seq
            if stage == "engine_e2e":
                out.append(s.finish_s - s.arrival_s)
            elif stage == "ttft":
                out.append(s.first_token_s - s.arrival_s)
            elif stage == "queue":
                out.append(s.scheduled_s - s.arrival_s)
            elif stage == "prefill":
                out.append(s.first_token_s - s.scheduled_s)
            elif stage == "decode":
                out.append(s.last_token_s - s.first_token_s)
            elif stage == "tpot" and s.generated > 1:
                out.append((s.last_token_s - s.first_token_s) / (s.generated - 1))
        return out

    def value(self, metric: str, records: list[RequestRecord]) -> float:
        """One metric over a set of records (see ``scenario.REGRESSION_METRICS``)."""
        if not records:
            return float("nan")
        if metric == "error_rate":
            return sum(r.status != "ok" for r in records) / len(records)
        if metric == "attempts_per_request":
            return sum(len(r.attempts) for r in records) / len(records)
        seqs = [a.seq for r in records for a in r.engine_spans if a.seq is not None]
        if metric == "preemptions_per_request":
            return sum(s.preemptions for s in seqs) / max(1, len(seqs))
        if metric == "prefix_hit_ratio":
            return sum(max(0, s.cached_tokens) for s in seqs) / max(1, sum(s.prompt_len for s in seqs))
        stage, _, q = metric.rpartition("_")
        return quantile(self._values(records, stage), 0.5 if q == "p50" else 0.99)

    def _itl(self, scope: dict[str, str]) -> tuple[float, float]:
        """ITL p99 from the replicas' ``vllm:inter_token_latency_seconds`` before and after the deploy."""
        before: EngineHistogram | None = None
        after: EngineHistogram | None = None
        for r in self.replicas:
            if "host.name" in scope and r.name != scope["host.name"]:
                continue
            snap = self.itl_at_deploy[r.name]
            final = r.stats.itl
            if before is None or after is None:
                before, after = EngineHistogram(final.bounds), EngineHistogram(final.bounds)
            for i, (b, f) in enumerate(zip(snap.counts, final.counts, strict=True)):
                before.counts[i] += b
                after.counts[i] += f - b
            before.count += snap.count
            after.count += final.count - snap.count
        if before is None or after is None:
            return float("nan"), float("nan")
        return before.quantile(0.99), after.quantile(0.99)

    def compare(self, metric: str, scope: dict[str, str] | None = None) -> tuple[float, float, float]:
        """``(baseline, candidate, change)``: change is a ratio, or a difference for ``error_rate``."""
        (b_lo, b_hi), (c_lo, c_hi) = self.windows()
        scope = scope or {}
        if metric == "itl_p99":
            base, cand = self._itl(scope)
            return base, cand, cand / base if base > 0 else float("nan")
        base = self.value(metric, self._select(b_lo, b_hi, scope))
        cand = self.value(metric, self._select(c_lo, c_hi, scope))
        if metric == "error_rate":
            return base, cand, cand - base
        return base, cand, (cand / base if base > 0 else float("inf") if cand > 0 else 1.0)


def run_scenario(scenario: Scenario, sink: TelemetrySink | None = None) -> ReplayResult:
    """Replay ``scenario`` (telemetry to ``sink`` if given) and return what happened."""
    started = time.perf_counter()
    profile = PROFILES[scenario.profile]
    workload = build_workload_for(scenario)
    deployed_engine = scenario.deploy.service == "vllm"
    engine_version = scenario.deploy.old_version if deployed_engine else "v1"
    replicas = [
        Replica(f"replica-{i + 1}", profile, scenario.engine_before, engine_version) for i in range(scenario.replicas)
    ]
    gateway = GatewayConfig(
        version=scenario.gateway_version if deployed_engine else scenario.deploy.old_version,
        routing=scenario.routing,
        dependencies=dict(scenario.dependencies),
        retry=scenario.retry,
    )
    events, faults = _runtime_changes(scenario)
    itl_at_deploy: dict[str, EngineHistogram] = {}

    def snapshot(sim: Simulation) -> None:
        itl_at_deploy.update((r.name, r.stats.itl.copy()) for r in sim.replicas)

    events.insert(0, (scenario.deploy.at_s, snapshot))
    sim = Simulation(
        workload,
        replicas,
        gateway,
        {name: route.dependencies for name, route in scenario.routes.items()},
        seed=scenario.seed,
        sink=sink,
        changes=events,
        faults=faults,
        metric_interval_s=scenario.scrape_interval_s,
    )
    records = sim.run()
    return ReplayResult(
        scenario, records, replicas, time.perf_counter() - started, scenario.workload.duration_s, started, itl_at_deploy
    )


def replay(
    scenario: Scenario,
    output: TelemetryOutput | None = None,
    *,
    speed: float | None = None,
    progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Replay ``scenario`` with its telemetry sent to ``output``.

    Args:
        output: where spans and metrics go (``None``: nowhere, measurement only).
        speed: pace the export at ``speed`` x real time, timestamps starting now
            (a live feed for a running server); ``None`` = as fast as possible,
            timestamps from the scenario's ``start_time``.
        progress: called with the simulated time (s) at every metric scrape.
    """
    if output is None:
        return run_scenario(scenario)
    epoch = time.time_ns() if speed else epoch_ns(scenario)
    emitter = TelemetryEmitter(output, epoch, seed=scenario.seed, attribute_set=scenario.attribute_set, speed=speed)
    emitter.progress = progress
    try:
        result = run_scenario(scenario, emitter)
    finally:
        emitter.close()
    result.wall_s = time.perf_counter() - result.started
    return result
