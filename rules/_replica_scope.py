"""Which replica a per-token slowdown is confined to, for the engine rules.

Not a rule: shared by ``decode_slowdown``, ``prefill_slowdown`` and ``stages``. A replica's
costs are compared with themselves across the deploy (at equal running batch and prompt size,
else at equal size alone) and with its peers' compared the same way (:func:`slowed_replica`);
:func:`replica_scope` turns the result into a finding's scope and evidence. Moved out of
:mod:`sre_agent.rules._engine_cost`, whose :class:`EngineCost` it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from sre_agent.analysis.compare import SIDES
from sre_agent.analysis.rules_api import Evidence
from sre_agent.rules._engine_cost import MIN_COVERAGE, MIN_SLOWDOWN, ConditionalShift, EngineCost, conditional_log_shift
from sre_agent.rules._load import SAME_LOAD
from sre_agent.rules._mechanism import MIN_BUCKET, Z_MIN, rnd

#: The other replicas' rise may be at most this share of the slowed one's for the slowdown to be its own.
REST_SHARE: Final[float] = 1 / 3
#: Peers a replica is compared with before a slowdown can be its own: with one, uneven routing
#: makes two replicas differ as much as a slowdown of one would.
MIN_PEERS: Final[int] = 2


@dataclass(frozen=True)
class SlowedReplica:
    """One replica whose per-token cost rose at equal buckets while the others' did not.

    Attributes:
        attribute / replica: how the spans name it (``host.name`` or ``service.instance.id``) and its value.
        own / rest: the cost's comparison on its requests, and on every other replica's.
        control: what both comparisons hold equal (``batch`` and prompt size, or ``size`` alone).
    """

    attribute: str
    replica: str
    own: ConditionalShift
    rest: ConditionalShift
    control: str


def slowed_replica(cost: EngineCost) -> SlowedReplica | None:
    """The replica a slowdown is confined to, if one is: compared with itself, at equal batch and size.

    A slower step on one replica (a bad GPU, a node with another driver) makes its requests
    costlier at equal batch while its peers' stay as they were; the peers' latency may still
    rise, as the router moves load onto them, which is why their tails are no test. The
    candidate is the replica whose mean log cost rose most; it is the scope when its own rise
    is >= :data:`MIN_SLOWDOWN` with z >= 2 and the rest, compared the same way (each comparison
    covering >= :data:`MIN_COVERAGE` of its requests), rose at most :data:`REST_SHARE` of it,
    compared at equal batch and prompt size, else (no significant equal-batch comparison) at
    equal prompt size alone, and then only when its running batch grew no more than its
    peers' (x1.1) or its requests did not (a replica given more load is costlier per token at
    equal size anyway; one whose requests stay longer runs more of them at once). At
    least :data:`MIN_PEERS` other replicas.
    """
    frame = cost.frame
    if frame is None or cost.replica_attribute is None or "replica" not in frame.columns:
        return None
    logged = frame.filter(pl.col(cost.column) > 0).with_columns(pl.col(cost.column).log().alias("_log"))
    means = logged.group_by("replica", "side").agg(pl.col("_log").mean(), pl.len().alias("n"))
    per: dict[str, dict[str, float]] = {}
    for row in means.iter_rows(named=True):
        if row["replica"] is not None and row["n"] >= MIN_BUCKET:
            per.setdefault(str(row["replica"]), {})[str(row["side"])] = float(row["_log"])
    raw = {r: sides["candidate"] - sides["baseline"] for r, sides in per.items() if len(sides) == len(SIDES)}
    if len(raw) < MIN_PEERS + 1:
        return None
    top = max(raw, key=lambda r: raw[r])
    mine, others = frame.filter(pl.col("replica") == top), frame.filter(pl.col("replica") != top)
    for bucket, label in (("bucket", "batch"), ("size_bucket", "size")):
        # A slower replica runs bigger batches at the same load (Little's law), so its equal-batch
        # buckets may not overlap; at equal prompt size alone the peers' rise then stands for what
        # load did to every replica, and the replica must rise well beyond it.
        own = conditional_log_shift(mine, cost.column, bucket, label)
        rest = conditional_log_shift(others, cost.column, bucket, label)
        # Both sides of the claim need a comparison over a fair share of their requests: that
        # this replica rose, and that the others, compared the same way, did not.
        if own is None or rest is None or min(own.coverage, rest.coverage) < MIN_COVERAGE:
            continue
        if own.z < Z_MIN or own.rise < MIN_SLOWDOWN:
            continue
        if (
            bucket == "size_bucket"
            and _batch_growth(mine) > (1 + SAME_LOAD) * _batch_growth(others)
            and _growth(mine) > (1 + SAME_LOAD) * _growth(others)
        ):
            # Its batch grew more than its peers' because the router gave it more requests: the
            # size-only comparison cannot tell. With its share of the requests kept, the batch grew
            # because its requests stayed longer, which is the slowdown itself (Little's law;
            # dev-unseen 1250068: decode x1.41 on replica-1, +39 % at equal size, z = 11.5).
            return None
        if rest.rise > REST_SHARE * own.rise:
            return None
        return SlowedReplica(cost.replica_attribute, top, own, rest, label)
    return None


#: z from which one replica's own rise is a slowdown where the pooled comparison saw none: the
#: largest of up to 16 replicas' rises at a family-wise 2.5 % (Bonferroni, 0.025 / 16).
CONFINED_Z: Final[float] = 3.0


def confined_slowdown(cost: EngineCost) -> tuple[dict[str, str], tuple[Evidence, ...], float, float] | None:
    """One replica's slowdown that pooling over every replica diluted below the bar: (scope, evidence, rise, z).

    A step 40 % slower on one replica of four is 6 % pooled over all of them (the pooled
    comparison's bar is 10 %), and the replica's requests carry the regression's tail while the
    pooled test stays quiet (dev-unseen 1250079: decode x1.41 on replica-4, +39 % on its own at
    z = 8.5, the others +0.6 %: "no rule explains the regression"). The replica is
    :func:`slowed_replica`'s, its own rise at z >= :data:`CONFINED_Z` (it is the largest of
    several), ``None`` otherwise.
    """
    scope, evidence = replica_scope(cost)
    found = cost.derived.get("slowed_replica")
    if not scope or not isinstance(found, SlowedReplica) or found.own.z < CONFINED_Z:
        return None
    return scope, evidence, found.own.rise, found.own.z


def _growth(frame: pl.DataFrame) -> float:
    """Candidate over baseline request count of ``frame`` (1.0 when a side has none)."""
    counts = {str(side): n for side, n in frame.group_by("side").len().iter_rows()}
    b, c = counts.get("baseline"), counts.get("candidate")
    return float(c) / float(b) if b and c else 1.0


def _batch_growth(frame: pl.DataFrame) -> float:
    """Candidate over baseline mean running batch of ``frame``'s requests (1.0 when unknown)."""
    if "running" not in frame.columns:
        return 1.0
    means = {str(side): value for side, value in frame.group_by("side").agg(pl.col("running").mean()).iter_rows()}
    b, c = means.get("baseline"), means.get("candidate")
    return float(c) / float(b) if b and c else 1.0


def replica_scope(cost: EngineCost) -> tuple[dict[str, str], tuple[Evidence, ...]]:
    """The scope and evidence of :func:`slowed_replica` for a slowdown finding (empty when none).

    Computed once per cost: the stage fallback and the slowdown rules both ask.
    """
    if "slowed_replica" not in cost.derived:  # stages and the slowdown rule both ask for the same cost
        cost.derived["slowed_replica"] = slowed_replica(cost)
    found = cost.derived["slowed_replica"]
    assert found is None or isinstance(found, SlowedReplica)
    if found is None:
        return {}, ()
    evidence = Evidence(
        f"{cost.column}_change_at_equal_{found.control}[{found.attribute}={found.replica}]",
        0.0,
        rnd(found.own.rise),
        f"this replica alone, z = {found.own.z:.1f}; the other replicas {found.rest.rise:+.0%}",
    )
    return {found.attribute: found.replica}, (evidence,)


__all__ = [
    "CONFINED_Z",
    "MIN_PEERS",
    "REST_SHARE",
    "SlowedReplica",
    "confined_slowdown",
    "replica_scope",
    "slowed_replica",
]
