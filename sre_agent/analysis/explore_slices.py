"""The console's slice table: which values of which attributes hold the tail regression.

Apart from :mod:`sre_agent.analysis.explore` because it carries a statistic of its own:
a difference-in-differences z per slice against a Bonferroni-corrected bar, so
that a random split of a uniform slowdown does not stand out. It reads the
scope and the SQL helpers of :mod:`sre_agent.analysis.explore` and keeps its rules: a
DuckDB cursor in, plain dataclasses out, the aggregation in SQL (one
``GROUPING SETS`` scan).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from sre_agent.analysis.attribute_keys import key_sql
from sre_agent.analysis.explore import Cursor, Scope, _metric_column, _quantiles, _scoped

__all__ = ["DEFAULT_DIMENSIONS", "SliceRow", "slices"]

# Family-wise false-positive rate of SliceRow.stands_out across the slices of one call.
STANDS_OUT_ALPHA = 0.05

# Slice dimensions: canonical columns or attribute keys, read as attribute_keys.key_sql spells them.
DEFAULT_DIMENSIONS: tuple[str, ...] = ("host_name", "model", "tenant_id", "http.route", "service_version")


# ---------------------------------------------------------------------- slices


@dataclass(frozen=True)
class SliceRow:
    """One value of one dimension and how much of the tail regression it holds.

    A request is slow above ``threshold`` (the baseline's overall p99);
    ``slow_share_*`` is the fraction of the slice's requests that are slow on
    each side (``None`` for a side with no requests of the slice).
    ``excess_slow`` counts candidate requests above that threshold
    beyond what the baseline's slow rate in the same slice predicts;
    ``contribution`` is that excess over the positive excess of all values of
    the same dimension (at most 1; negative for a slice that improved;
    ``None`` when no value of the dimension got worse).

    A share of the excess alone does not locate a regression: under a
    uniform slowdown each half of a random 50/50 split holds about half of
    it. ``z`` is the difference-in-differences of slow shares, the slice's
    rise against the rise in all other requests, in standard errors
    (binomial, each of the four proportions); ``stands_out`` is true when
    ``z`` clears a one-sided 5 % test Bonferroni-corrected for every slice
    tested in the same call, so a random split stands out in at most 5 % of
    calls.
    """

    dimension: str
    value: str
    requests_baseline: int
    requests_candidate: int
    slow_share_baseline: float | None
    slow_share_candidate: float | None
    excess_slow: float
    contribution: float | None
    z: float | None = None
    stands_out: bool = False


def slices(
    cur: Cursor,
    scope: Scope,
    metric: str = "e2e",
    dimensions: Iterable[str] = DEFAULT_DIMENSIONS,
    limit: int = 50,
) -> list[SliceRow]:
    """Slices of every dimension, those that stand out first, then by contribution; one GROUPING SETS scan."""
    col = _metric_column(metric)
    dims = list(dimensions)
    threshold = _quantiles(cur, scope, col, 0.99).get("baseline")
    if threshold is None:
        return []
    params: dict[str, Any] = {"t": threshold}
    side_expr, where = _scoped(scope, params)
    cols = ", ".join(f"{key_sql(d)} AS d{i}" for i, d in enumerate(dims))
    sets = ", ".join(f"(d{i})" for i in range(len(dims)))
    sql = f"""
        WITH scoped AS (SELECT {side_expr} AS side, {col} AS v, {cols} FROM spans WHERE {where})
        SELECT {", ".join(f"d{i}" for i in range(len(dims)))}, {", ".join(f"grouping(d{i})" for i in range(len(dims)))},
               count(*) FILTER (WHERE side = 'baseline') AS nb,
               count(*) FILTER (WHERE side = 'candidate') AS nc,
               count(*) FILTER (WHERE side = 'baseline' AND v > $t) AS sb,
               count(*) FILTER (WHERE side = 'candidate' AND v > $t) AS sc
        FROM scoped GROUP BY GROUPING SETS ({sets}, ())"""
    n = len(dims)
    grouped = cur.execute(sql, params).fetchall()
    total = next((r[2 * n :] for r in grouped if all(r[n : 2 * n])), None)
    if total is None:
        return []
    nb_all, nc_all, sb_all, sc_all = total
    global_slow_rate = sb_all / nb_all if nb_all else 0.0
    raw: list[tuple[str, str, int, int, float | None, float | None, float, float | None]] = []
    for row in grouped:
        values, groupings = row[:n], row[n : 2 * n]
        if all(groupings):
            continue
        nb, nc, sb, sc = row[2 * n :]
        i = next(j for j, g in enumerate(groupings) if not g)
        # A slice that is a whole side (the new version in a before/after comparison) localises nothing.
        if values[i] is None or (nc == nc_all and nb in (0, nb_all)) or (nb == nb_all and nc in (0, nc_all)):
            continue
        # Expected slow count at the slice's baseline slow rate; a slice new in the candidate uses the global rate.
        excess = sc - nc * (sb / nb if nb else global_slow_rate)
        share_b, share_c = sb / nb if nb else None, sc / nc if nc else None
        z = _rise_against_rest((nb, nc, sb, sc), (nb_all - nb, nc_all - nc, sb_all - sb, sc_all - sc))
        raw.append((dims[i], str(values[i]), int(nb), int(nc), share_b, share_c, float(excess), z))
    positive: dict[str, float] = {}
    for d, *_rest, ex, _z in raw:
        positive[d] = positive.get(d, 0.0) + max(ex, 0.0)
    z_crit = NormalDist().inv_cdf(1 - STANDS_OUT_ALPHA / max(len(raw), 1))
    rows = [
        SliceRow(
            d, v, nb, nc, pb, pc, ex, ex / positive[d] if positive[d] > 0 else None, z, z is not None and z >= z_crit
        )
        for d, v, nb, nc, pb, pc, ex, z in raw
    ]
    # Slices that stand out first: the top row is where the regression is, when it is anywhere.
    rows.sort(key=lambda r: (not r.stands_out, -(r.contribution or 0.0), -r.excess_slow, r.dimension, r.value))
    return rows[:limit]


Counts = tuple[int, int, int, int]  # baseline requests, candidate requests, baseline slow, candidate slow


def _rise_against_rest(part: Counts, rest: Counts) -> float | None:
    """z of (slice's slow-share rise) - (rest's slow-share rise); ``None`` when a side has no requests.

    A slice absent from the baseline is compared on the candidate side only
    (its baseline share taken as the rest's). Variances use shares smoothed
    by half a request so that a side with no slow requests still has one.
    """
    (nb, nc, sb, sc), (nb_r, nc_r, sb_r, sc_r) = part, rest
    if nc == 0 or nc_r == 0 or nb_r == 0:
        return None

    def share_var(slow: int, n: int) -> tuple[float, float]:
        p = (slow + 0.5) / (n + 1)
        return slow / n, p * (1 - p) / n

    pc, vc = share_var(sc, nc)
    pc_r, vc_r = share_var(sc_r, nc_r)
    pb_r, vb_r = share_var(sb_r, nb_r)
    if nb == 0:
        diff, var = pc - pc_r, vc + vc_r
    else:
        pb, vb = share_var(sb, nb)
        diff, var = (pc - pb) - (pc_r - pb_r), vc + vb + vc_r + vb_r
    return diff / math.sqrt(var)
