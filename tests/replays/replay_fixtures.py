"""Small builders shared by the replay tests (scenarios adapted in code, never hand-set latencies)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sre_agent.replays.engine import EngineConfig
from sre_agent.replays.scenario import Scenario, load_scenario
from sre_agent.replays.workload import Tenant

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "data" / "traces"


def scenario_with(
    base: str = "none_version_bump",
    *,
    engine: EngineConfig | None = None,
    after: EngineConfig | None = None,
    duration_s: float | None = None,
    replicas: int | None = None,
    profile: str | None = None,
    trace: str | None = None,
    tenants: tuple[Tenant, ...] | None = None,
    rate_scale: float | None = None,
    loop_s: float | str | None = "keep",
) -> Scenario:
    """A bundled scenario with some fields replaced (deploy kept at half the duration)."""
    sc = load_scenario(base)
    workload = sc.workload
    if duration_s is not None:
        workload = dataclasses.replace(workload, duration_s=duration_s)
    if trace is not None:
        workload = dataclasses.replace(workload, trace=trace)
    if tenants is not None:
        workload = dataclasses.replace(workload, tenants=tenants)
    if rate_scale is not None:
        workload = dataclasses.replace(workload, rate_scale=rate_scale)
    if loop_s != "keep":
        workload = dataclasses.replace(workload, loop_s=loop_s)  # type: ignore[arg-type]
    before = engine or sc.engine_before
    return dataclasses.replace(
        sc,
        workload=workload,
        engine_before=before,
        engine_after=after or before,
        replicas=replicas or sc.replicas,
        profile=profile or sc.profile,
        deploy=dataclasses.replace(sc.deploy, at_s=workload.duration_s / 2),
    )
