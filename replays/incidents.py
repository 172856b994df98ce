"""A seeded generator of post-deploy incidents nobody tuned the rules for (issue 12, build 2).

:func:`generate` turns one integer seed into an :class:`Incident`: a
:class:`~sre_agent.replays.scenario.Scenario` built from random draws over
what real fleets vary, plus how its telemetry is shaped and the truth a
correct diagnosis gives. :func:`write_incident` replays it into OTLP JSON
lines (what ``sre-agent ingest`` reads) and checks the truth against what the
simulator measured.

What varies, per incident:

- **fleet**: 2-16 replicas (fewer when the request budget of one incident
  would be exceeded), GPU profile, routing policy (least loaded, round robin,
  random, prefix affinity);
- **traffic**: one of the real traces (Azure conversation or code, Mooncake
  conversation or synthetic) when ``traces_dir`` is given, else the bundled
  Azure conversation sample; a random entry point; the arrival rate, set so
  the replicas run a target batch size (Little's law over the cost model);
  the trace's own burstiness (Azure code: CV of inter-arrivals about 13);
  1-5 tenants with their own system prompts, conversation habits, length
  scaling and route shares;
- **measurement**: scrape interval 5-30 s, windows 5-30 min a side and about
  200-5,000 requests a side;
- **deploy style**: hot swap; rolling restart (each replica leaves the pool
  for a few seconds and comes back with an empty prefix cache); canary split
  (part of the fleet runs the new version while the rest keeps the old one,
  diagnosed as a version pair);
- **telemetry shape**: vLLM V1, vLLM V0, SGLang; gateway spans plus engine
  metrics (no engine spans); spans without metrics; metrics without spans;
- **cause**: every cause of the vocabulary, with magnitudes from borderline
  (1.2x) to severe, sometimes confined to one replica or one tenant, and in
  some incidents a second, benign change at the same deploy.

Each shape only draws causes it can show (a dependency regression is not
drawn for metrics without spans): the table is :data:`SHAPE_CAUSES`.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan

from sre_agent.replays.costmodel import PROFILES, Profile
from sre_agent.replays.engine import EngineConfig
from sre_agent.replays.gateway import RetryPolicy
from sre_agent.replays.outputs import JsonLinesOutput, TelemetryOutput
from sre_agent.replays.replay import ReplayResult, quantile, replay
from sre_agent.replays.scenario import (
    DEFAULT_DEPENDENCIES,
    Change,
    Deploy,
    Expected,
    Scenario,
    WorkloadSpec,
)
from sre_agent.replays.telemetry import GATEWAY_SERVICE
from sre_agent.replays.workload import TRACE_FILES, Route, Tenant, load_trace

__all__ = [
    "DEPLOY_STYLES",
    "SHAPES",
    "SHAPE_CAUSES",
    "Incident",
    "Truth",
    "generate",
    "write_incident",
]

#: Telemetry shapes: engine attribute set, and which of engine spans / gateway spans / metrics are kept.
SHAPES: dict[str, tuple[str, bool, bool, bool]] = {
    "vllm-v1": ("v1", True, True, True),
    "vllm-v0": ("v0", True, True, True),
    "sglang": ("sglang", True, True, True),
    "gateway-spans+metrics": ("v1", False, True, True),
    "spans-only": ("v1", True, True, False),
    "metrics-only": ("v1", False, False, True),
}
_ALL_CAUSES = (
    "none", "capacity", "load", "batch_composition", "kv_pressure", "prefix_cache", "traffic_mix",
    "dependency", "decode_slowdown", "prefill_slowdown", "retry_amplification", "errors",
)  # fmt: skip
#: Causes each shape can show. Without engine spans there are no token counts per request
#: (traffic_mix, prefill per token); without metrics no KV usage, preemption or prefix-cache
#: counters; without gateway spans no dependency, attempt or HTTP status.
SHAPE_CAUSES: dict[str, tuple[str, ...]] = {
    "vllm-v1": _ALL_CAUSES,
    "vllm-v0": _ALL_CAUSES,
    "sglang": _ALL_CAUSES,
    "gateway-spans+metrics": (
        *("none", "capacity", "load", "kv_pressure", "prefix_cache", "dependency", "decode_slowdown"),
        *("retry_amplification", "errors"),
    ),
    "spans-only": tuple(c for c in _ALL_CAUSES if c not in ("kv_pressure", "prefix_cache")),
    "metrics-only": ("none", "capacity", "load", "kv_pressure", "prefix_cache", "decode_slowdown"),
}
#: Causes a canary split can carry: only what travels with the new version's replicas.
_CANARY_CAUSES = ("none", "batch_composition", "kv_pressure", "prefix_cache", "decode_slowdown", "prefill_slowdown")
DEPLOY_STYLES = ("hot_swap", "rolling_restart", "canary_split")
_ROUTING = ("least_loaded", "least_loaded", "round_robin", "random", "prefix_affinity")
_TENANT_NAMES = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell")
# Per-trace mean lengths (tokens) and reuse, measured once from the published files; used only
# to aim the arrival rate at a batch size, never as a truth.
_TRACE_SHAPE: dict[str, tuple[float, float]] = {
    "azure-conv": (1155.0, 211.0),
    "azure-code": (2048.0, 28.0),
    "mooncake-conversation": (12035.0, 343.0),
    "mooncake-synthetic": (15325.0, 149.0),
    "azure-conv-sample": (1155.0, 211.0),
}
MAX_REQUESTS_PER_SIDE = 1200
_START = datetime(2026, 1, 15, 9, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Truth:
    """What a correct diagnosis says: the cause, the slice it is confined to, the stage it acts in."""

    cause: str
    scope: dict[str, str] = field(default_factory=dict)
    stage: str | None = None
    magnitude: float = 1.0
    detail: str = ""
    second_change: str | None = None


@dataclass(frozen=True)
class Incident:
    """One generated incident: the scenario to replay, how to observe it, and its truth."""

    seed: int
    scenario: Scenario
    truth: Truth
    trace: str
    deploy_style: str
    shape: str
    window_s: float
    knobs: dict[str, Any]

    def deploy_time(self) -> str:
        """ISO 8601 time of the deploy (the start of a rollout)."""
        at = _START + timedelta(seconds=self.scenario.deploy.at_s)
        return at.isoformat().replace("+00:00", "Z")

    def selection_args(self) -> list[str]:
        """The ``sre-agent diagnose`` selection for this incident."""
        if self.deploy_style == "canary_split":
            return [
                "--baseline-version", self.scenario.deploy.old_version,
                "--candidate-version", self.scenario.deploy.new_version,
            ]  # fmt: skip
        return ["--deploy-at", self.deploy_time()]

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary: truth, style, shape and the knobs drawn."""
        return {
            "seed": self.seed,
            "truth": {
                "cause": self.truth.cause,
                "scope": self.truth.scope,
                "stage": self.truth.stage,
                "magnitude": round(self.truth.magnitude, 3),
                "detail": self.truth.detail,
                "second_change": self.truth.second_change,
            },
            "trace": self.trace,
            "deploy_style": self.deploy_style,
            "shape": self.shape,
            "window_s": self.window_s,
            "replicas": self.scenario.replicas,
            "profile": self.scenario.profile,
            "routing": self.scenario.routing,
            "scrape_interval_s": self.scenario.scrape_interval_s,
            "selection": self.selection_args(),
            "knobs": self.knobs,
        }


# --------------------------------------------------------------------------- drawing


def _loguniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _per_replica_rate(profile: Profile, batch: float, in_tokens: float, out_tokens: float) -> float:
    """Requests per second per replica that keep about ``batch`` sequences running (Little's law).

    A request spends ``out`` decode steps of ``fixed + (per_seq + per_ctx_token * ctx) * batch``
    seconds and its uncached prompt (about half, a rough reuse figure) in prefill.
    """
    c = profile.cost
    ctx = in_tokens + out_tokens / 2
    step = c.fixed_s + (c.decode_seq_s + c.context_token_s * ctx) * batch
    service = out_tokens * step + 0.5 * in_tokens * c.prefill_token_s
    rate = batch / service
    # keep prefill work under ~60 % of the engine's time so the baseline is not already saturated
    prefill_cap = 0.6 / max(1e-9, 0.5 * in_tokens * c.prefill_token_s)
    return min(rate, prefill_cap)


def _tenants(rng: random.Random, n: int, long_inputs: bool) -> tuple[Tenant, ...]:
    names = rng.sample(_TENANT_NAMES, n)
    out = []
    for name in names:
        rag = rng.random() < 0.5
        routes = {"/v1/chat/completions": 1.0} if not rag else {"/v1/chat/completions": 0.5, "/v1/rag/chat": 0.5}
        out.append(
            Tenant(
                name,
                weight=round(_loguniform(rng, 0.5, 4.0), 2),
                system_prompt_tokens=rng.choice((0, 128, 256, 512, 768, 1024, 1536)),
                continue_prob=round(rng.uniform(0.0, 0.7), 2),
                input_scale=round(_loguniform(rng, 0.2, 0.6) if long_inputs else _loguniform(rng, 0.6, 1.6), 2),
                output_scale=round(_loguniform(rng, 0.6, 1.5), 2),
                routes=routes,
            )
        )
    return tuple(out)


def _pick_shape_style_cause(rng: random.Random) -> tuple[str, str, str]:
    style = rng.choices(DEPLOY_STYLES, weights=(0.55, 0.25, 0.2))[0]
    shape = rng.choices(tuple(SHAPES), weights=(0.4, 0.15, 0.15, 0.1, 0.1, 0.1))[0]
    if style == "canary_split" and not SHAPES[shape][1]:
        # a version pair is told apart by the engine spans' service.version: without them it is a hot swap
        style = "hot_swap"
    causes = SHAPE_CAUSES[shape]
    if style == "canary_split":
        causes = tuple(c for c in causes if c in _CANARY_CAUSES)
    if style == "rolling_restart":
        # a rollout is an engine deploy: gateway-side causes come with a gateway deploy instead
        causes = tuple(c for c in causes if c not in ("dependency", "retry_amplification"))
    # none is drawn about as often as a frequent cause, so false alarms are measured
    weights = [2.0 if c == "none" else 1.0 for c in causes]
    return shape, style, rng.choices(causes, weights=weights)[0]


def generate(seed: int, traces_dir: str | Path | None = None, max_per_side: int = MAX_REQUESTS_PER_SIDE) -> Incident:
    """The incident of ``seed`` (a pure function of its arguments).

    Args:
        seed: any integer; the same seed gives the same incident.
        traces_dir: a folder laid out like ``../shared/data/traces``; ``None``
            uses only the trace sample bundled with the package.
        max_per_side: request budget of one side (bounds the fleet, then the window), so that
            one incident replays, ingests and diagnoses in seconds.
    """
    rng = random.Random(f"incident-{seed}")
    shape, style, cause = _pick_shape_style_cause(rng)
    if traces_dir is not None:
        trace_name = rng.choice(tuple(TRACE_FILES))
        trace = str(Path(traces_dir) / TRACE_FILES[trace_name])
    else:
        trace_name = trace = "azure-conv-sample"
    in_mean, out_mean = _TRACE_SHAPE[trace_name]
    long_inputs = trace_name.startswith("mooncake")
    profile_name = rng.choice(
        ("llama3-8b-h100", "llama3-70b-h100x4")
        if long_inputs
        else ("llama3-8b-h100", "llama3-70b-h100x4", "llama3-8b-a10g")
    )
    profile = PROFILES[profile_name]
    tenants = _tenants(rng, rng.randint(1, 5), long_inputs)
    scale_in = sum(t.weight * t.input_scale for t in tenants) / sum(t.weight for t in tenants)
    scale_out = sum(t.weight * t.output_scale for t in tenants) / sum(t.weight for t in tenants)
    # capacity and load incidents need a loaded fleet to show; others run anywhere from light to busy
    batch = _loguniform(rng, 12, 48) if cause in ("capacity", "load", "kv_pressure") else _loguniform(rng, 3, 40)
    per_replica = _per_replica_rate(profile, batch, in_mean * scale_in + 300, out_mean * scale_out)
    window_s = float(rng.choice((300, 420, 600, 900, 1200, 1800)))
    target_per_side = _loguniform(rng, 200, max_per_side)
    replicas = rng.choice((2, 2, 3, 4, 4, 6, 8, 12, 16))
    # the request budget bounds the fleet (down to a drawn floor), then the window, then the load
    floor = min(replicas, rng.choice((2, 3, 4, 6)))
    while replicas > floor and per_replica * replicas * window_s > max_per_side:
        replicas -= 1
    window_s = max(300.0, min(window_s, target_per_side / (per_replica * replicas)))
    if per_replica * replicas * window_s > max_per_side:
        per_replica = max_per_side / (replicas * window_s)
    rate = per_replica * replicas
    rows = load_trace(trace)
    trace_span = rows[-1].arrival_s - rows[0].arrival_s
    rate_scale = rate / (len(rows) / trace_span)
    # the candidate window replays the baseline's slice of the trace (loop_s, in trace seconds), so
    # before and after carry the same real traffic and only the deploy differs
    loop_s = window_s * rate_scale
    start_s = rng.uniform(0.0, max(0.0, trace_span - loop_s))
    magnitude = _loguniform(rng, 1.2, 4.0)
    at_s = window_s
    old_v, new_v = f"2026.01.{rng.randint(10, 20)}-{rng.randint(1, 9)}", ""
    new_v = old_v.replace("2026.01.", "2026.02.")
    routes = {
        "/v1/chat/completions": Route("/v1/chat/completions", ("guardrail",), rng.choice((512, 1024, 2048))),
        "/v1/rag/chat": Route("/v1/rag/chat", ("retrieval", "guardrail"), rng.choice((512, 1024))),
    }
    engine = EngineConfig(
        max_num_batched_tokens=rng.choice((4096, 8192, 8192, 16384)),
        max_num_seqs=rng.choice((64, 128, 256, 256)),
    )
    base = Scenario(
        name=f"incident-{seed}",
        path=None,
        description="",
        seed=seed % 1_000_000_007,
        workload=WorkloadSpec(
            trace=trace,
            start_s=start_s,
            duration_s=2 * window_s,
            rate_scale=rate_scale,
            loop_s=loop_s if loop_s < trace_span else None,
            tenants=tenants,
        ),
        routes=routes,
        dependencies=dict(DEFAULT_DEPENDENCIES),
        routing=rng.choice(_ROUTING),
        retry=RetryPolicy(),
        gateway_version="gw-2026.01.14",
        replicas=replicas,
        profile=profile_name,
        engine_before=engine,
        engine_after=engine,
        deploy=Deploy(at_s=at_s, service="vllm", old_version=old_v, new_version=new_v),
        changes=(),
        expected=Expected(cause=cause, max_regression=("e2e_p99", 10.0)),
        attribute_set=SHAPES[shape][0],
        start_time=_START.isoformat().replace("+00:00", "Z"),
        scrape_interval_s=float(rng.choice((5, 10, 15, 30))),
    )
    scenario, truth, knobs = _apply_cause(rng, base, cause, magnitude, style, batch)
    scenario, truth = _second_change(rng, scenario, truth, style)
    scenario = _apply_style(rng, scenario, style)
    knobs.update(batch_target=round(batch, 1), rate_rps=round(rate, 2), trace=trace_name)
    return Incident(seed, scenario, truth, trace_name, style, shape, window_s, knobs)


# --------------------------------------------------------------------------- causes


def _host(rng: random.Random, scenario: Scenario) -> str:
    return f"replica-{rng.randint(1, scenario.replicas)}"


def _apply_cause(  # noqa: PLR0917 - one draw's context, passed once
    rng: random.Random, s: Scenario, cause: str, m: float, style: str, batch: float
) -> tuple[Scenario, Truth, dict[str, Any]]:
    """Put ``cause`` into the deploy of ``s`` with magnitude ``m`` (>= 1.2); ``batch``: the aimed running batch."""
    at = s.deploy.at_s
    eng = s.engine_before
    one_host_ok = style == "hot_swap" and s.replicas >= 3
    knobs: dict[str, Any] = {}
    scope: dict[str, str] = {}
    stage: str | None = None
    detail = ""
    changes: list[Change] = []
    if cause == "none":
        if rng.random() < 0.3 and style == "hot_swap":
            s = replace(s, deploy=replace(s.deploy, service=GATEWAY_SERVICE, old_version="gw-2026.01.14",
                                          new_version="gw-2026.01.15"))  # fmt: skip
            detail = "gateway version bump, nothing else"
        else:
            detail = "engine version bump, nothing else"
    elif cause == "capacity":
        stage = "queue"
        if rng.random() < 0.5 and style != "canary_split":
            gone = max(1, min(s.replicas - 1, round(s.replicas * (1 - 1 / m))))
            names = rng.sample([f"replica-{i + 1}" for i in range(s.replicas)], gone)
            changes += [Change(at, "remove_replica", {"replica": n}) for n in names]
            detail = f"{gone} of {s.replicas} replicas removed"
        else:
            seqs = max(2, round(batch / m))
            eng = replace(eng, max_num_seqs=min(seqs, eng.max_num_seqs))
            detail = f"max_num_seqs {s.engine_before.max_num_seqs} -> {eng.max_num_seqs}"
    elif cause == "load":
        stage = "queue"
        mult = min(m, 2.0)
        changes.append(Change(at, "rate", {"multiplier": mult}))
        detail = f"arrival rate x{mult:.2f} at the deploy"
    elif cause == "batch_composition":
        if rng.random() < 0.5:
            budget = rng.choice((256, 512, 1024))
            eng = replace(eng, max_num_batched_tokens=budget)
            stage, detail = "prefill", f"max_num_batched_tokens {s.engine_before.max_num_batched_tokens} -> {budget}"
        else:
            limit = PROFILES[s.profile].max_model_len
            eng = replace(
                eng, enable_chunked_prefill=False, max_num_batched_tokens=max(limit, eng.max_num_batched_tokens)
            )
            stage, detail = "decode", "chunked prefill turned off"
    elif cause == "kv_pressure":
        stage = "queue"
        prof = PROFILES[s.profile]
        limit = min(prof.max_model_len, 32768 if s.workload.trace.endswith("jsonl") else 8192)
        used = batch * (_mean_tokens(s) + 256)
        # room for two of the longest requests: with less, one long prompt can starve the engine
        blocks = max(2 * limit // eng.block_size + 64, int(used / m / eng.block_size))
        s = replace(s, engine_before=replace(s.engine_before, max_model_len=limit))
        eng = replace(eng, max_model_len=limit, num_gpu_blocks=blocks)
        detail = f"num_gpu_blocks -> {blocks} ({blocks * eng.block_size} tokens)"
    elif cause == "prefix_cache":
        stage = "prefill"
        s = _with_prefix_reuse(rng, s)
        if rng.random() < 0.65:
            eng = replace(eng, enable_prefix_caching=False)
            detail = "prefix caching turned off"
        else:
            changes.append(Change(at, "template_break", {}))
            detail = "prompt template puts a per-request value first"
    elif cause == "traffic_mix":
        s, stage, detail = _new_traffic(rng, s, m, changes)
    elif cause == "dependency":
        stage = "dependency"
        s = replace(s, deploy=replace(s.deploy, service=GATEWAY_SERVICE, old_version="gw-2026.01.14",
                                      new_version="gw-2026.01.15"))  # fmt: skip
        tenant = None
        if rng.random() < 0.4 and len(s.workload.tenants) >= 2:
            tenant = max(s.workload.tenants, key=lambda t: t.weight * rng.uniform(0.5, 1.5))
            scope = {"tenant.id": tenant.name}
        dep = "guardrail"
        if tenant is None or "/v1/rag/chat" in tenant.routes:
            dep = rng.choice(("guardrail", "retrieval"))
        callers = [r.name for r in s.routes.values() if dep in r.dependencies]
        if tenant is None and len(callers) == 1 and len(s.routes) > 1:
            # a dependency one route alone calls (retrieval behind RAG) slows that route's requests only
            scope = {"http.route": callers[0]}
        base = s.dependencies[dep]
        params: dict[str, Any] = {"dependency": dep, "median_s": base.median_s * m * 2, "sigma": base.sigma}
        if tenant is not None:
            params["tenant"] = tenant.name
        changes.append(Change(at, "dependency", params))
        detail = f"{dep} median x{m * 2:.1f}" + (f" for tenant {tenant.name}" if tenant else "")
    elif cause in ("decode_slowdown", "prefill_slowdown"):
        stage = "decode" if cause == "decode_slowdown" else "prefill"
        factor = "decode_factor" if cause == "decode_slowdown" else "prefill_factor"
        eng = replace(eng, decode_factor=m) if cause == "decode_slowdown" else replace(eng, prefill_factor=m)
        detail = f"{factor} x{m:.2f}"
        if one_host_ok and rng.random() < 0.35:
            host = _host(rng, s)
            s = replace(s, deploy=replace(s.deploy, replicas=(host,)))
            scope = {"host.name": host}
            detail += f" on {host} only"
    elif cause == "retry_amplification":
        stage = "gateway"
        s = replace(s, deploy=replace(s.deploy, service=GATEWAY_SERVICE, old_version="gw-2026.01.14",
                                      new_version="gw-2026.01.15"))  # fmt: skip
        if rng.random() < 0.5:
            host = _host(rng, s)
            rate = min(0.6, 0.08 * m)
            s = replace(s, retry=RetryPolicy(max_attempts=3))
            changes.append(Change(at, "fault", {"replica": host, "error_rate": rate, "status": 503}))
            detail = f"{host} answers 503 to {rate:.0%}, the gateway retries"
        else:
            timeout = _e2e_hint(s, batch) / m
            s = replace(s, deploy=replace(s.deploy, retry=RetryPolicy(max_attempts=3, attempt_timeout_s=timeout)))
            detail = f"new gateway retries attempts after {timeout:.1f} s"
    elif cause == "errors":
        rate = min(0.3, 0.02 * m * m)
        params = {"error_rate": rate, "status": rng.choice((500, 500, 503))}
        if one_host_ok and rng.random() < 0.3:
            host = _host(rng, s)
            params["replica"] = host
            scope = {"host.name": host}
            rate = rate * 3 if rate * 3 < 0.9 else 0.9
            params["error_rate"] = rate
        changes.append(Change(at, "fault", params))
        detail = f"engine answers {params['status']} to {rate:.0%}" + (f" on {scope['host.name']}" if scope else "")
    else:  # pragma: no cover - the cause list is closed above
        raise ValueError(cause)
    knobs["change"] = detail
    s = replace(s, engine_after=eng, changes=(*s.changes, *changes))
    return s, Truth(cause, scope, stage, m, detail), knobs


def _mean_tokens(s: Scenario) -> float:
    in_mean, out_mean = _TRACE_SHAPE.get(_trace_key(s.workload.trace), (1155.0, 211.0))
    t = s.workload.tenants
    w = sum(x.weight for x in t)
    return sum(x.weight * (in_mean * x.input_scale + out_mean * x.output_scale) for x in t) / w


def _e2e_hint(s: Scenario, batch: float) -> float:
    """A rough typical e2e (s): decode steps at the aimed batch, for a retry timeout near the tail."""
    prof = PROFILES[s.profile]
    _, out_mean = _TRACE_SHAPE.get(_trace_key(s.workload.trace), (1155.0, 211.0))
    step = prof.cost.fixed_s + prof.cost.decode_seq_s * batch
    return max(0.5, 3.0 * out_mean * step)


def _trace_key(trace: str) -> str:
    for key, rel in TRACE_FILES.items():
        if trace.endswith(rel):
            return key
    return trace


def _with_prefix_reuse(rng: random.Random, s: Scenario) -> Scenario:
    """Make sure the traffic shares prefixes (a cache that saves nothing cannot regress)."""
    if s.workload.trace.endswith("jsonl"):
        return s
    tenants = tuple(
        replace(t, system_prompt_tokens=max(t.system_prompt_tokens, rng.choice((768, 1024, 1536))),
                continue_prob=max(t.continue_prob, 0.4))
        for t in s.workload.tenants
    )  # fmt: skip
    return replace(s, workload=replace(s.workload, tenants=tenants))


def _new_traffic(rng: random.Random, s: Scenario, m: float, changes: list[Change]) -> tuple[Scenario, str, str]:
    """A tenant whose requests are longer than the rest starts sending (or grows) at the deploy."""
    at = s.deploy.at_s
    longer_prompts = rng.random() < 0.5
    what = "longer prompts" if longer_prompts else "longer answers"
    total = sum(t.weight for t in s.workload.tenants)
    share = min(0.6, 0.12 * m)
    # longer, but inside the context limit (a rejected prompt is an error, not a mix change)
    in_mean, out_mean = _TRACE_SHAPE.get(_trace_key(s.workload.trace), (1155.0, 211.0))
    limit = PROFILES[s.profile].max_model_len
    max_in_scale = 0.3 * limit / in_mean
    max_out_scale = 0.1 * limit / out_mean
    new_weight = total * share / (1 - share)
    if rng.random() < 0.6 or len(s.workload.tenants) == 1:
        name = "newco"
        tenant = Tenant(
            name,
            weight=0.0,
            system_prompt_tokens=rng.choice((0, 256, 2048)),
            continue_prob=rng.uniform(0.0, 0.3),
            input_scale=min(max_in_scale, _loguniform(rng, 2.5, 6.0)) if longer_prompts else 1.0,
            output_scale=min(max_out_scale, _loguniform(rng, 2.5, 5.0)) if not longer_prompts else 0.5,
            routes={"/v1/chat/completions": 1.0},
        )
        s = replace(s, workload=replace(s.workload, tenants=(*s.workload.tenants, tenant)))
        detail = f"new tenant {name} ({share:.0%} of traffic, {what})"
    else:
        tenants = list(s.workload.tenants)
        i = rng.randrange(len(tenants))
        t = tenants[i]
        tenants[i] = replace(
            t,
            input_scale=min(max_in_scale, t.input_scale * (_loguniform(rng, 2.5, 5.0) if longer_prompts else 1.0)),
            output_scale=min(
                max_out_scale, t.output_scale * (_loguniform(rng, 2.5, 4.0) if not longer_prompts else 1.0)
            ),
            weight=min(t.weight, total * 0.1),
        )
        name = t.name
        s = replace(s, workload=replace(s.workload, tenants=tuple(tenants)))
        detail = f"tenant {name} grows to {share:.0%} of traffic ({what})"
    changes.append(Change(at, "mix", {"weights": {name: new_weight}}))
    return s, ("prefill" if longer_prompts else "decode"), detail


def _second_change(rng: random.Random, s: Scenario, truth: Truth, style: str) -> tuple[Scenario, Truth]:
    """Sometimes a second, benign change ships with the deploy (it must not take the blame)."""
    if rng.random() >= 0.2:
        return s, truth
    at = s.deploy.at_s
    kind = rng.choice(("rate", "seqs", "dep"))
    if kind == "rate" and truth.cause not in ("load", "capacity"):
        mult = rng.uniform(0.9, 1.08)
        s = replace(s, changes=(*s.changes, Change(at, "rate", {"multiplier": mult})))
        note = f"arrival rate x{mult:.2f}"
    elif kind == "seqs" and truth.cause != "capacity":
        s = replace(s, engine_after=replace(s.engine_after, max_num_seqs=min(512, s.engine_after.max_num_seqs * 2)))
        note = "max_num_seqs doubled (more room, no regression)"
    elif truth.cause != "dependency":
        base = s.dependencies["guardrail"]
        params = {"dependency": "guardrail", "median_s": base.median_s * 0.8, "sigma": base.sigma}
        s = replace(s, changes=(*s.changes, Change(at, "dependency", params)))
        note = "guardrail 20% faster"
    else:
        return s, truth
    return s, replace(truth, second_change=note)


def _apply_style(rng: random.Random, s: Scenario, style: str) -> Scenario:
    """Hot swap (as drawn), a rolling restart with cold caches, or a canary split with both versions live."""
    if s.deploy.service != "vllm" or style == "hot_swap":
        return s
    names = [f"replica-{i + 1}" for i in range(s.replicas)]
    if style == "canary_split":
        share = rng.choice((0.25, 0.5))
        canary = tuple(names[: max(1, round(s.replicas * share))])
        # both versions serve from the start: the comparison is concurrent, not before/after
        return replace(s, deploy=replace(s.deploy, at_s=0.0, replicas=canary),
                       changes=tuple(replace(c, at_s=0.0) for c in s.changes))  # fmt: skip
    if s.deploy.replicas is not None:  # a one-host change is a hot swap of that host
        return s
    removed = {str(c.params["replica"]) for c in s.changes if c.kind == "remove_replica"}
    names = [n for n in names if n not in removed]
    if len(names) < 2:  # one replica left: restarting it would leave nobody serving, so it is swapped hot
        return replace(s, deploy=replace(s.deploy, replicas=None))
    stagger = rng.uniform(5.0, 20.0)
    down = min(stagger * 0.8, rng.uniform(2.0, 10.0))
    at = s.deploy.at_s
    steps = tuple(
        Change(at + i * stagger, "rollout", {"replica": n, "down_s": down, "cold_cache": True})
        for i, n in enumerate(names)
    )
    return replace(s, deploy=replace(s.deploy, replicas=()), changes=(*s.changes, *steps))


# --------------------------------------------------------------------------- telemetry and truth check


class ShapedOutput:
    """A :class:`~sre_agent.replays.outputs.TelemetryOutput` that keeps only what a telemetry shape carries."""

    def __init__(self, inner: TelemetryOutput, shape: str) -> None:
        _, self.engine_spans, self.gateway_spans, self.metrics = SHAPES[shape]
        self.inner = inner

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        """Pass on the spans of the services this shape keeps."""
        kept = [
            span
            for span in spans
            if (self.gateway_spans if span.resource.attributes.get("service.name") == GATEWAY_SERVICE
                else self.engine_spans)
        ]  # fmt: skip
        if kept:
            self.inner.export_spans(kept)

    def export_metrics(self, data: MetricsData) -> None:
        """Pass on a scrape when this shape has metrics."""
        if self.metrics:
            self.inner.export_metrics(data)

    def shutdown(self) -> None:
        """Shut the wrapped output down."""
        self.inner.shutdown()


def _effect(result: ReplayResult, incident: Incident) -> dict[str, float]:
    """What the simulator measured: ratios (or deltas) of the signals the truth claims, in its scope."""
    scope = dict(incident.truth.scope)
    if incident.deploy_style == "canary_split":
        # concurrent versions: compare the canary replicas' requests with the others' over the whole run
        canary = set(incident.scenario.deploy.replicas or ())

        def side(new: bool) -> list[Any]:
            return [r for r in result.records if r.attempts and (r.attempts[-1].replica in canary) == new]

        base, cand = side(False), side(True)
    else:
        (b_lo, b_hi), (c_lo, c_hi) = result.windows()
        base, cand = result._select(b_lo, b_hi, scope), result._select(c_lo, c_hi, scope)
    out: dict[str, float] = {
        "requests_baseline": len(base),
        "requests_candidate": len(cand),
        "baseline_ttft_p99_s": result.value("ttft_p99", base),
    }
    for metric in ("e2e_p99", "ttft_p99", "tpot_p99", "tpot_p50", "queue_p99", "prefill_p99", "dependency_p99"):
        stage, _, label = metric.rpartition("_")
        q = 0.5 if label == "p50" else 0.99
        b_values, c_values = result._values(base, stage), result._values(cand, stage)
        b, c = quantile(b_values, q), quantile(c_values, q)  # what result.value(metric, ...) reads
        out[metric] = c / b if b > 0 else float("nan")
        out[f"{metric}_apart"] = float(_apart(b_values, c_values, q))
    for metric in ("error_rate", "attempts_per_request", "preemptions_per_request", "prefix_hit_ratio"):
        out[metric] = result.value(metric, cand) - result.value(metric, base)
    return {k: round(v, 4) for k, v in out.items()}


def _order_interval(values: list[float], q: float, z: float = 1.96) -> tuple[float, float] | None:
    """Distribution-free 95 % interval of the ``q`` quantile: the order statistics at ranks n q -+ z sqrt(n q (1-q))."""
    n = len(values)
    if n == 0:
        return None
    ordered = sorted(values)
    half = z * math.sqrt(n * q * (1.0 - q))
    lo = max(0, math.floor(n * q - half) - 1)
    hi = min(n - 1, math.ceil(n * q + half) - 1)
    return ordered[lo], ordered[hi]


def _apart(base: list[float], cand: list[float], q: float) -> bool:
    """Whether the candidate's ``q`` quantile lies beyond sampling noise: the two 95 % intervals do not overlap.

    Computed on the simulator's own per-request values, independently of the diagnosis: a p99 of
    1,200 requests rests on 12 of them, and a realised ratio of 1.2 between two such p99s is often
    nothing but which 12 requests fell in the tail.
    """
    b, c = _order_interval(base, q), _order_interval(cand, q)
    return b is not None and c is not None and c[0] > b[1]


def _visible(cause: str, e: dict[str, float], *, beyond_noise: bool = True) -> bool:
    """Whether the truth is not a guess: the cause's effect shows beyond sampling noise, on a baseline not saturated.

    A latency ratio counts only when its quantiles are apart (:func:`_apart`); effects stored
    before that measure existed (no ``*_apart`` entries) count as before. With ``beyond_noise``
    false, the realised ratios count as they are: whether the simulator changed anything at all
    (``shows`` in the summary, which mechanism tests on small samples assert).
    """

    def ratio(*names: str) -> float:
        return max(
            (e[n] for n in names if e[n] == e[n] and (not beyond_noise or e.get(f"{n}_apart", 1.0) > 0)),
            default=1.0,
        )

    latency = ratio("e2e_p99", "ttft_p99", "tpot_p99")
    if min(e["requests_baseline"], e["requests_candidate"]) < 150:
        return False  # a side too thin to compare (a bursty trace slice that went quiet)
    if not e["baseline_ttft_p99_s"] < 30.0:
        # the baseline fleet is already saturated (first tokens after half a minute): no operator
        # would call that a healthy baseline, so no cause can be told apart from the backlog
        return False
    if cause == "none":
        # "Nothing changed" is only the truth when nothing users feel changed: a rolling restart
        # that ran short of replicas, or a canary split whose router gave the canary more than its
        # share, slows the tail by the deploy's own mechanics, and calling that "no regression"
        # would be the wrong answer (the incident is skipped, not scored either way).
        return latency < 1.15
    if cause in ("capacity", "load", "batch_composition", "traffic_mix"):
        return latency >= 1.15
    if cause == "kv_pressure":
        return e["preemptions_per_request"] >= 0.02 and latency >= 1.1
    if cause == "prefix_cache":
        return e["prefix_hit_ratio"] <= -0.1 and ratio("ttft_p99", "prefill_p99") >= 1.1
    if cause == "dependency":
        return ratio("dependency_p99") >= 1.3
    if cause == "decode_slowdown":
        return ratio("tpot_p50") >= 1.1
    if cause == "prefill_slowdown":
        return ratio("prefill_p99", "ttft_p99") >= 1.1
    if cause == "retry_amplification":
        return e["attempts_per_request"] >= 0.03
    if cause == "errors":
        return e["error_rate"] >= 0.01
    return True


def write_incident(incident: Incident, directory: str | Path) -> dict[str, Any]:
    """Replay ``incident`` into ``directory/telemetry.jsonl.gz`` and write ``truth.json`` beside it.

    Returns the description (:meth:`Incident.describe`) with ``effect``: what the
    simulator measured, ``visible``: whether the cause's effect shows in it beyond sampling
    noise (an incident whose cause does not is skipped by the benchmark, not scored), and
    ``shows``: whether the realised ratios moved at all (:func:`_visible`).
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    shaped = ShapedOutput(JsonLinesOutput(out / "telemetry.jsonl.gz"), incident.shape)
    result = replay(incident.scenario, shaped)
    effect = _effect(result, incident)
    info = incident.describe()
    info["effect"] = effect
    info["visible"] = _visible(incident.truth.cause, effect)
    info["shows"] = _visible(incident.truth.cause, effect, beyond_noise=False)
    info["simulated_requests"] = len(result.records)
    (out / "truth.json").write_text(json.dumps(info, indent=2, sort_keys=True), encoding="utf-8")
    return info


def replay_into_store(incident: Incident, db: str | Path) -> tuple[dict[str, Any], Any]:
    """Replay ``incident`` straight into a DuckDB store (no files); returns (effect summary, the Selection).

    The in-process twin of :func:`write_incident` + ``sre-agent ingest`` for tests.
    """
    from sre_agent.analysis.selection import Selection
    from sre_agent.replays.outputs import StoreOutput
    from sre_agent.replays.replay import epoch_ns

    result = replay(incident.scenario, ShapedOutput(StoreOutput.open(db), incident.shape))
    info = incident.describe()
    info["effect"] = _effect(result, incident)
    info["visible"] = _visible(incident.truth.cause, info["effect"])
    info["shows"] = _visible(incident.truth.cause, info["effect"], beyond_noise=False)
    deploy = incident.scenario.deploy
    if incident.deploy_style == "canary_split":
        selection = Selection(
            mode="versions", baseline_version=deploy.old_version, candidate_version=deploy.new_version
        )
    else:
        selection = Selection(mode="deploy_at", deploy_at_ns=epoch_ns(incident.scenario) + int(deploy.at_s * 1e9))
    return info, selection
