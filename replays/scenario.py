"""Scenario files (``replays/scenarios/*.toml``, CONTRACTS section 5): loading and validation.

A scenario names a workload, the serving topology, the engine configuration
before and after a deploy, the deploy, other changes, a seed and the
expected diagnosis. Every key is checked: an unknown or mistyped key raises
:class:`~sre_agent.errors.ScenarioError` naming the file and the key.
``replays/scenarios/README.md`` documents the format with an example; the
defaults below (tenants, routes, dependencies) give a realistic gateway so
that a scenario file only states what it is about.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from sre_agent.analysis.rules_api import CAUSES as RULE_CAUSES
from sre_agent.errors import ScenarioError
from sre_agent.replays.costmodel import PROFILES
from sre_agent.replays.engine import EngineConfig
from sre_agent.replays.gateway import LatencyDist, RetryPolicy
from sre_agent.replays.telemetry import ATTRIBUTE_SETS
from sre_agent.replays.workload import Route, Tenant

__all__ = [
    "CAUSES",
    "CHANGE_KINDS",
    "REGRESSION_METRICS",
    "SCENARIO_DIR",
    "Change",
    "Deploy",
    "Expected",
    "Scenario",
    "WorkloadSpec",
    "list_scenarios",
    "load_scenario",
]

SCENARIO_DIR = Path(__file__).parent / "scenarios"

# The closed cause vocabulary of CONTRACTS section 3, as the rules know it.
CAUSES = frozenset(RULE_CAUSES)
CHANGE_KINDS = frozenset({"rate", "mix", "dependency", "remove_replica", "fault", "retry", "template_break", "rollout"})
# Metrics a scenario may claim; "<stage>_p50|p99" are ratios, "error_rate" is an absolute delta.
REGRESSION_METRICS = frozenset(
    {
        f"{m}_{q}"
        for m in ("e2e", "engine_e2e", "ttft", "tpot", "queue", "prefill", "decode", "dependency")
        for q in ("p50", "p99")
    }
    | {"error_rate", "attempts_per_request", "preemptions_per_request", "prefix_hit_ratio", "itl_p99"}
)

DEFAULT_ROUTES: dict[str, Route] = {
    "/v1/chat/completions": Route("/v1/chat/completions", ("guardrail",), 1000),
    "/v1/rag/chat": Route("/v1/rag/chat", ("retrieval", "guardrail"), 1000),
}
DEFAULT_TENANTS: tuple[Tenant, ...] = (
    Tenant("acme", 3.0, 512, 0.5, routes={"/v1/chat/completions": 0.6, "/v1/rag/chat": 0.4}),
    Tenant("globex", 2.0, 768, 0.4, routes={"/v1/chat/completions": 1.0}),
    Tenant("initech", 1.0, 256, 0.6, routes={"/v1/chat/completions": 0.5, "/v1/rag/chat": 0.5}),
)
DEFAULT_DEPENDENCIES: dict[str, LatencyDist] = {
    "guardrail": LatencyDist(0.025, 0.3),
    "retrieval": LatencyDist(0.080, 0.4),
    "tokenizer": LatencyDist(0.004, 0.3),
}


@dataclass(frozen=True)
class WorkloadSpec:
    """Which trace, which part of it, how fast, and who sends it."""

    trace: str = "azure-conv-sample"
    start_s: float = 0.0
    duration_s: float = 1200.0
    rate_scale: float = 1.0
    loop_s: float | None = None
    # for trace = "synthetic"
    rate_per_s: float = 5.0
    input_mean: int = 1000
    output_mean: int = 200
    tenants: tuple[Tenant, ...] = DEFAULT_TENANTS


@dataclass(frozen=True)
class Deploy:
    """The deploy: when, which service, which versions, and (for the gateway) what changes."""

    at_s: float
    service: str = "vllm"
    old_version: str = "v1"
    new_version: str = "v2"
    replicas: tuple[str, ...] | None = None
    retry: RetryPolicy | None = None
    routing: str | None = None


@dataclass(frozen=True)
class Change:
    """Another change at ``at_s`` (kind in :data:`CHANGE_KINDS`); ``params`` holds its keys."""

    at_s: float
    kind: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Expected:
    """The diagnosis a correct tool gives, and the size of regression the replay must show.

    ``min_regression`` / ``max_regression``: ``(metric, value)``; ratios
    (candidate / baseline) for latency metrics, an absolute increase for
    ``error_rate``. ``none`` scenarios give ``max_regression``.
    """

    cause: str
    scope: Mapping[str, str] = field(default_factory=dict)
    stage: str | None = None
    min_regression: tuple[str, float] | None = None
    max_regression: tuple[str, float] | None = None


@dataclass(frozen=True)
class Scenario:
    """A parsed, validated scenario file."""

    name: str
    path: Path | None
    description: str
    seed: int
    workload: WorkloadSpec
    routes: dict[str, Route]
    dependencies: dict[str, LatencyDist]
    routing: str
    retry: RetryPolicy
    gateway_version: str
    replicas: int
    profile: str
    engine_before: EngineConfig
    engine_after: EngineConfig
    deploy: Deploy
    changes: tuple[Change, ...]
    expected: Expected
    attribute_set: str = "v1"
    start_time: str = "2026-01-15T09:00:00Z"
    scrape_interval_s: float = 5.0

    def scaled(self, factor: float) -> Scenario:
        """The same scenario over ``factor`` of its duration (deploy and change times scale too)."""
        return replace(
            self,
            workload=replace(
                self.workload,
                duration_s=self.workload.duration_s * factor,
                loop_s=self.workload.loop_s * factor if self.workload.loop_s else None,
            ),
            deploy=replace(self.deploy, at_s=self.deploy.at_s * factor),
            changes=tuple(replace(c, at_s=c.at_s * factor) for c in self.changes),
        )


T = TypeVar("T")


class _Table:
    """A TOML table whose keys are consumed one by one; leftovers are errors."""

    def __init__(self, data: Mapping[str, Any], where: str, file: str) -> None:
        if not isinstance(data, Mapping):
            raise ScenarioError(f"{file}: {where or 'top level'} must be a table")
        self.data = dict(data)
        self.where = where
        self.file = file

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def take(
        self,
        name: str,
        kind: type[T] | tuple[type, ...],
        default: Any = ...,
        convert: Callable[[Any], Any] | None = None,
    ) -> Any:
        if name not in self.data:
            if default is ...:
                raise ScenarioError(f"{self.file}: missing key {self.key(name)!r}")
            return default
        value = self.data.pop(name)
        ok_types = kind if isinstance(kind, tuple) else (kind,)
        if float in ok_types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, ok_types) or (isinstance(value, bool) and bool not in ok_types):
            names = "/".join(t.__name__ for t in ok_types)
            raise ScenarioError(f"{self.file}: {self.key(name)} must be {names}, got {value!r}")
        return convert(value) if convert else value

    def sub(self, name: str, default_empty: bool = True) -> _Table:
        value = self.data.pop(name, {} if default_empty else ...)
        if value is ...:
            raise ScenarioError(f"{self.file}: missing table {self.key(name)!r}")
        return _Table(value, self.key(name), self.file)

    def done(self, known: tuple[str, ...] = ()) -> None:
        for extra in self.data:
            hint = difflib.get_close_matches(extra, known, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ScenarioError(f"{self.file}: unknown key {self.key(extra)!r}{suggestion}")


_ENGINE_KEYS = tuple(f.name for f in fields(EngineConfig))


def _engine(table: _Table, base: EngineConfig) -> EngineConfig:
    updates: dict[str, Any] = {}
    for f in fields(EngineConfig):
        if f.name not in table.data:
            continue
        if f.name.startswith("enable_"):
            updates[f.name] = table.take(f.name, bool)
        elif f.name.endswith("_factor"):
            updates[f.name] = table.take(f.name, float)
        else:
            updates[f.name] = table.take(f.name, int)
    table.done(_ENGINE_KEYS)
    config = replace(base, **updates)
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < (config.max_model_len or 0):
        raise ScenarioError(
            f"{table.file}: {table.where}: with chunked prefill off, max_num_batched_tokens must be >= max_model_len"
        )
    return config


def _latency(table: _Table) -> LatencyDist:
    dist = LatencyDist(table.take("median_s", float), table.take("sigma", float, 0.3))
    table.done(("median_s", "sigma"))
    return dist


def _retry(table: _Table, base: RetryPolicy) -> RetryPolicy:
    out = RetryPolicy(
        max_attempts=table.take("max_attempts", int, base.max_attempts),
        attempt_timeout_s=table.take("attempt_timeout_s", float, base.attempt_timeout_s),
        backoff_base_s=table.take("backoff_base_s", float, base.backoff_base_s),
        backoff_max_s=table.take("backoff_max_s", float, base.backoff_max_s),
        retry_on=tuple(table.take("retry_on", list, list(base.retry_on))),
    )
    table.done(("max_attempts", "attempt_timeout_s", "backoff_base_s", "backoff_max_s", "retry_on"))
    return out


def _tenant(table: _Table) -> Tenant:
    tenant = Tenant(
        name=table.take("name", str),
        weight=table.take("weight", float, 1.0),
        system_prompt_tokens=table.take("system_prompt_tokens", int, 400),
        continue_prob=table.take("continue_prob", float, 0.5),
        input_scale=table.take("input_scale", float, 1.0),
        output_scale=table.take("output_scale", float, 1.0),
        routes={k: float(v) for k, v in table.take("routes", dict, {"/v1/chat/completions": 1.0}).items()},
    )
    table.done(("name", "weight", "system_prompt_tokens", "continue_prob", "input_scale", "output_scale", "routes"))
    return tenant


def _regression(table: _Table, name: str) -> tuple[str, float] | None:
    if name not in table.data:
        return None
    sub = table.sub(name)
    metric = sub.take("metric", str)
    if metric not in REGRESSION_METRICS:
        raise ScenarioError(f"{table.file}: {sub.key('metric')} {metric!r} is not one of {sorted(REGRESSION_METRICS)}")
    value = sub.take("ratio", float, None)
    if value is None:
        value = sub.take("delta", float)
    sub.done(("metric", "ratio", "delta"))
    return metric, value


def load_scenario(path: str | Path) -> Scenario:
    """Parse and validate one scenario file (a path, or a name under ``replays/scenarios``)."""
    p = Path(path)
    if not p.is_file() and (SCENARIO_DIR / f"{path}.toml").is_file():
        p = SCENARIO_DIR / f"{path}.toml"
    file = str(p)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ScenarioError(f"{file}: no such scenario (see `sre-agent replay --list`)") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{file}: invalid TOML: {exc}") from exc
    except UnicodeDecodeError:
        raise ScenarioError(f"{file}: not a scenario file (not UTF-8 text)") from None
    except OSError as exc:  # a directory, no permission
        raise ScenarioError(f"{file}: cannot read the scenario: {exc.strerror or exc}") from exc
    top = _Table(data, "", file)
    name = top.take("name", str, p.stem)
    description = top.take("description", str, "")
    seed = top.take("seed", int, 1)
    attribute_set = top.take("attribute_set", str, "v1")
    if attribute_set not in ATTRIBUTE_SETS:
        raise ScenarioError(f"{file}: attribute_set must be one of {', '.join(map(repr, ATTRIBUTE_SETS))}")
    start_time = top.take("start_time", str, "2026-01-15T09:00:00Z")
    scrape_interval_s = top.take("scrape_interval_s", float, 5.0)
    if not 1.0 <= scrape_interval_s <= 60.0:
        raise ScenarioError(f"{file}: scrape_interval_s must be between 1 and 60 seconds")

    wl = top.sub("workload")
    tenants_raw = wl.take("tenants", list, None)
    tenants = (
        tuple(_tenant(_Table(t, f"workload.tenants[{i}]", file)) for i, t in enumerate(tenants_raw))
        if tenants_raw
        else DEFAULT_TENANTS
    )
    workload = WorkloadSpec(
        trace=wl.take("trace", str, "azure-conv-sample"),
        start_s=wl.take("start_s", float, 0.0),
        duration_s=wl.take("duration_s", float, 1200.0),
        rate_scale=wl.take("rate_scale", float, 1.0),
        loop_s=wl.take("loop_s", float, None),
        rate_per_s=wl.take("rate_per_s", float, 5.0),
        input_mean=wl.take("input_mean", int, 1000),
        output_mean=wl.take("output_mean", int, 200),
        tenants=tenants,
    )
    wl.done(tuple(f.name for f in fields(WorkloadSpec)))

    routes = dict(DEFAULT_ROUTES)
    routes_t = top.sub("routes")
    for route_name in list(routes_t.data):
        rt = routes_t.sub(route_name)
        routes[route_name] = Route(
            route_name,
            tuple(rt.take("dependencies", list, [])),
            rt.take("max_tokens", int, 1000),
            rt.take("temperature", float, 0.7),
            rt.take("top_p", float, 0.95),
        )
        rt.done(("dependencies", "max_tokens", "temperature", "top_p"))
    for tenant in tenants:
        for route_name in tenant.routes:
            if route_name not in routes:
                raise ScenarioError(f"{file}: tenant {tenant.name!r} uses undefined route {route_name!r}")

    gw = top.sub("gateway")
    dependencies = dict(DEFAULT_DEPENDENCIES)
    deps_t = gw.sub("dependencies")
    for dep_name in list(deps_t.data):
        dependencies[dep_name] = _latency(deps_t.sub(dep_name))
    for route in routes.values():
        for dep_name in route.dependencies:
            if dep_name not in dependencies:
                raise ScenarioError(f"{file}: route {route.name!r} calls undefined dependency {dep_name!r}")
    routing = gw.take("routing", str, "least_loaded")
    retry = _retry(gw.sub("retry"), RetryPolicy())
    gateway_version = gw.take("version", str, "gw-1")
    gw.done(("dependencies", "routing", "retry", "version"))

    topo = top.sub("topology")
    replicas = topo.take("replicas", int, 4)
    profile = topo.take("profile", str, "llama3-8b-h100")
    if profile not in PROFILES:
        raise ScenarioError(f"{file}: topology.profile {profile!r} is not one of {sorted(PROFILES)}")
    topo.done(("replicas", "profile"))

    eng = top.sub("engine")
    before = _engine(eng.sub("before"), EngineConfig())
    after = _engine(eng.sub("after"), before)
    eng.done(("before", "after"))

    dep = top.sub("deploy", default_empty=False)
    deploy = Deploy(
        at_s=dep.take("at_s", float),
        service=dep.take("service", str, "vllm"),
        old_version=dep.take("old_version", str, "v1"),
        new_version=dep.take("new_version", str, "v2"),
        replicas=tuple(dep.take("replicas", list)) if "replicas" in dep.data else None,
        retry=_retry(dep.sub("retry"), retry) if "retry" in dep.data else None,
        routing=dep.take("routing", str, None),
    )
    dep.done(("at_s", "service", "old_version", "new_version", "replicas", "retry", "routing"))
    if deploy.service not in ("vllm", "llm-gateway"):
        raise ScenarioError(f"{file}: deploy.service must be 'vllm' or 'llm-gateway'")

    changes: list[Change] = []
    for i, raw in enumerate(top.take("changes", list, [])):
        ct = _Table(raw, f"changes[{i}]", file)
        at_s = ct.take("at_s", float)
        kind = ct.take("kind", str)
        if kind not in CHANGE_KINDS:
            raise ScenarioError(f"{file}: changes[{i}].kind {kind!r} is not one of {sorted(CHANGE_KINDS)}")
        changes.append(Change(at_s, kind, dict(ct.data)))

    ex = top.sub("expected", default_empty=False)
    cause = ex.take("cause", str)
    if cause not in CAUSES:
        raise ScenarioError(f"{file}: expected.cause {cause!r} is not one of {sorted(CAUSES)}")
    expected = Expected(
        cause=cause,
        scope={str(k): str(v) for k, v in ex.take("scope", dict, {}).items()},
        stage=ex.take("stage", str, None),
        min_regression=_regression(ex, "min_regression"),
        max_regression=_regression(ex, "max_regression"),
    )
    ex.done(("cause", "scope", "stage", "min_regression", "max_regression"))
    if expected.min_regression is None and expected.max_regression is None:
        raise ScenarioError(f"{file}: expected needs min_regression (or max_regression for cause 'none')")
    top.done(
        ("name", "description", "seed", "attribute_set", "start_time", "scrape_interval_s", "workload", "routes",
         "gateway", "topology", "engine", "deploy", "changes", "expected")
    )  # fmt: skip
    return Scenario(
        name=name,
        path=p,
        description=description,
        seed=seed,
        workload=workload,
        routes=routes,
        dependencies=dependencies,
        routing=routing,
        retry=retry,
        gateway_version=gateway_version,
        replicas=replicas,
        profile=profile,
        engine_before=before,
        engine_after=after,
        deploy=deploy,
        changes=tuple(changes),
        expected=expected,
        attribute_set=attribute_set,
        start_time=start_time,
        scrape_interval_s=scrape_interval_s,
    )


def list_scenarios() -> list[Path]:
    """Bundled scenario files, sorted by name."""
    return sorted(SCENARIO_DIR.glob("*.toml"))
