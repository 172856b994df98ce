"""Slice localisation on hand-built request frames (the comparison's ``requests`` and ``dimensions``).

The frames are built here rather than through a store so that the one
property under test, which slices count as the same slice, is set exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from sre_agent.analysis.localise import localise
from sre_agent.analysis.rules_api import Regression

REGRESSION = Regression(metric="e2e", quantile=0.9, baseline=1.0, candidate=3.0, ci=(1.5, 2.5), significant=True)
DIMENSIONS = ["host.name", "service.instance.id", "service.version", "tenant.id"]


@dataclass
class _Requests:
    """What :func:`localise` reads of a comparison."""

    requests: pl.DataFrame
    dimensions: list[str]


def _fleet(*, tenant_matches_counts: bool) -> _Requests:
    """Four replicas; the deploy put version v2 on replica-2 alone, and 3 in 4 of its requests got slow.

    A quarter of replica-1's candidate requests are slow too, and replica-2 was never slow
    before, so the slices' excess shares differ with their baselines. With
    ``tenant_matches_counts`` the tenant ``acme`` holds replica-2's slow candidate requests
    and as many fast ones of replica-1 as replica-2 has fast ones: the same counts as
    replica-2 on the candidate side, but not the same requests.
    """
    rng = np.random.default_rng(7)
    rows = []
    for side in ("baseline", "candidate"):
        for i in range(2000):
            replica = f"replica-{i % 4 + 1}"
            version = "v2" if side == "candidate" and replica == "replica-2" else "v1"
            slow = side == "candidate" and (
                (replica == "replica-2" and i % 16 < 12) or (replica == "replica-1" and i % 16 < 4)
            )
            tenant = "other"
            if tenant_matches_counts and side == "candidate":
                in_tenant = (slow and replica == "replica-2") or (replica == "replica-1" and i % 16 >= 12)
                tenant = "acme" if in_tenant else "other"
            elif tenant_matches_counts and i % 4 == 0:
                tenant = "acme"  # the tenant's baseline: a quarter of the traffic
            # Fast candidate requests (and all of replica-2's before) stay below the baseline's p90.
            below = side == "candidate" or replica == "replica-2"
            fast = rng.uniform(0.5, 0.6) if below else rng.uniform(0.5, 1.5)
            e2e = float(rng.uniform(5.0, 6.0) if slow else fast)
            rows.append({"side": side, "e2e_s": e2e, "host.name": replica, "service.instance.id": replica,
                         "service.version": version, "tenant.id": tenant})  # fmt: skip
    return _Requests(pl.DataFrame(rows), DIMENSIONS)


def test_a_version_deployed_to_one_replica_is_scoped_as_that_replica_too() -> None:
    result = localise(_fleet(tenant_matches_counts=False), REGRESSION)  # type: ignore[arg-type]
    assert result.scope == {"host.name": "replica-2", "service.instance.id": "replica-2", "service.version": "v2"}
    # The new version has no baseline, so its excess is measured against the overall slow rate
    # and differs from replica-2's: equal shares would not have found the alias.
    shares = {(s.dimension, s.value): s.excess_share for s in result.slices}
    assert abs(shares[("host.name", "replica-2")] - shares[("service.version", "v2")]) >= 0.02


def test_equal_counts_of_other_requests_are_not_the_same_slice() -> None:
    result = localise(_fleet(tenant_matches_counts=True), REGRESSION)  # type: ignore[arg-type]
    by_slice = {(s.dimension, s.value): s for s in result.slices}
    replica, tenant = by_slice[("host.name", "replica-2")], by_slice[("tenant.id", "acme")]
    assert (tenant.candidate_requests, tenant.candidate_slow) == (replica.candidate_requests, replica.candidate_slow)
    assert result.scope.get("host.name") == "replica-2"
    assert "tenant.id" not in result.scope


def _long_prompts(*, factor_rest: float) -> _Requests:
    """Two tenants; ``long`` sends prompts 4x as long. Every candidate request of ``long`` is 1.8x
    slower; the ``short`` tenant's requests are ``factor_rest`` x slower.

    The baseline p90 sits inside the long tenant's range, so a uniform slowdown pushes mostly
    its requests over it: the long tenant holds the excess either way.
    """
    rng = np.random.default_rng(11)
    rows = []
    for side in ("baseline", "candidate"):
        for i in range(3000):
            tenant = "long" if i % 4 == 0 else "short"
            e2e = float(rng.lognormal(np.log(4.0 if tenant == "long" else 1.0), 0.25))
            if side == "candidate":
                e2e *= 1.8 if tenant == "long" else factor_rest
            replica = f"replica-{i % 3}"
            rows.append({"side": side, "e2e_s": e2e, "host.name": replica, "service.instance.id": replica,
                         "service.version": side, "tenant.id": tenant})  # fmt: skip
    return _Requests(pl.DataFrame(rows), ["host.name", "tenant.id"])


def test_a_slowdown_of_every_request_is_not_the_slice_of_the_longest_ones() -> None:
    # Every request 1.8x slower: the long tenant holds nearly all requests over the baseline
    # p90 (concentration, lift and z all point at it), but the short tenant's own p90 rose as
    # much. Before the rest-of-traffic check the scope named tenant "long".
    result = localise(_long_prompts(factor_rest=1.8), REGRESSION)  # type: ignore[arg-type]
    best = result.best
    assert best is not None
    assert (best.dimension, best.value) == ("tenant.id", "long")
    assert best.excess_share >= 0.6
    assert best.lift >= 3.0
    assert result.scope == {}


def test_a_slowdown_of_one_tenants_requests_is_that_tenant() -> None:
    result = localise(_long_prompts(factor_rest=1.0), REGRESSION)  # type: ignore[arg-type]
    assert result.scope == {"tenant.id": "long"}
