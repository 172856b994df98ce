"""Store side of the canary gate: two SQL scans turn a comparison into :class:`SideStats`.

The populations come from :mod:`sre_agent.compare` (the same resolution
``diagnose`` uses, including derived latencies). Only summaries travel into
Python: per-side counts, and the handful of exact order statistics each
confidence sequence needs (``quantile_disc`` at chosen ranks), so one verdict
on millions of spans stays well under a second.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from sre_agent.canary import CanarySpec, QuantileEstimate, QuantileNeed, SideStats
from sre_agent.compare import SIDES, Comparison, resolve_windows
from sre_agent.sequential import histogram_quantile_cs, point_rank, quantile_cs_ranks

if TYPE_CHECKING:
    import duckdb

    from sre_agent.selection import Selection

__all__ = ["gather", "top_findings"]

log = logging.getLogger(__name__)

#: SLO metric -> engine-span column (after compare's derivations).
SPAN_COLUMN: Final[dict[str, str]] = {
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "itl": "tpot_s",
    "e2e": "e2e_s",
    "queue": "queue_s",
}
#: SLO metric -> histogram signal (sre_agent.schema.METRIC_SIGNALS).
HISTOGRAM_SIGNAL: Final[dict[str, str]] = {
    "ttft": "ttft_seconds",
    "tpot": "itl_seconds",
    "itl": "itl_seconds",
    "e2e": "e2e_seconds",
    "queue": "queue_seconds",
}
#: Longest time the diagnosis may add to a verdict, seconds.
FINDINGS_BUDGET_S: Final[float] = 4.0
#: Requests per side the diagnosis samples for mix and slice analysis (bounds its run time).
FINDINGS_SAMPLE_PER_SIDE: Final[int] = 20_000
_ERROR = "(status_code = 'error' OR error_type IS NOT NULL)"


def _counts(comparison: Comparison, spec: CanarySpec) -> dict[str, dict[str, int]]:
    """side -> {requests, errors, good, n_<column>} in one scan."""
    columns = sorted(set(SPAN_COLUMN.values()))
    good_parts = [f"NOT {_ERROR}"]
    for s in spec.latency_slos:
        assert s.metric is not None
        good_parts.append(f"coalesce({SPAN_COLUMN[s.metric]} <= {float(s.threshold)!r}, TRUE)")
    selects = [
        "side",
        "count(*) AS requests",
        f"count(*) FILTER (WHERE {_ERROR}) AS errors",
        f"count(*) FILTER (WHERE {' AND '.join(good_parts)}) AS good",
        *(f"count({c}) AS n_{c}" for c in columns),
    ]
    inner = comparison.engine_sql("side, status_code, error_type, " + ", ".join(columns))
    sql = f"SELECT {', '.join(selects)} FROM {inner} GROUP BY side"
    cursor = comparison.con.execute(sql)
    names = [d[0] for d in cursor.description]
    out: dict[str, dict[str, int]] = {side: dict.fromkeys(names[1:], 0) for side in SIDES}
    for row in cursor.fetchall():
        out[row[0]] = {k: int(v or 0) for k, v in zip(names[1:], row[1:], strict=True)}
    return out


def _source(metric: str, counts: dict[str, dict[str, int]], comparison: Comparison) -> str:
    """``spans`` or the histogram signal a metric is read from (decided on the candidate side)."""
    hist_signal = HISTOGRAM_SIGNAL[metric]
    spans_have = counts["candidate"][f"n_{SPAN_COLUMN[metric]}"] > 0

    def hist_has() -> bool:
        return comparison.metrics.histogram(hist_signal)["candidate"] is not None

    # ITL is per token: the engine's histogram is the real thing, TPOT per request the fallback.
    if metric == "itl":
        return hist_signal if hist_has() else "spans"
    if spans_have:
        return "spans"
    return hist_signal if hist_has() else "spans"


def _span_quantiles(
    comparison: Comparison, needs: list[QuantileNeed], counts: dict[str, dict[str, int]]
) -> dict[tuple[str, str], QuantileEstimate]:
    """Exact order statistics for every span-based need, in one scan; keyed by (side, need key)."""
    plan: dict[tuple[str, str], list[int]] = {}  # (side, column) -> ranks wanted
    spots: dict[tuple[str, str], tuple[str, int, int | None, int | None, int]] = {}
    for need in needs:
        column = SPAN_COLUMN[need.metric]
        n = counts[need.side][f"n_{column}"]
        if n == 0:
            continue
        lower, upper = quantile_cs_ranks(n, need.quantile, need.alpha)
        point = point_rank(n, need.quantile)
        ranks = plan.setdefault((need.side, column), [])
        ranks.extend(r for r in (lower, upper, point) if r is not None)
        spots[(need.side, need.key)] = (column, n, lower, upper, point)
    if not plan:
        return {}
    aggregates: list[str] = []
    order: list[tuple[str, str, list[int]]] = []
    for (side, column), ranks in plan.items():
        unique = sorted(set(ranks))
        n = counts[side][f"n_{column}"]
        # quantile_disc(x, (k - 0.5) / n) is exactly the k-th order statistic (1-based).
        fractions = ", ".join(repr((k - 0.5) / n) for k in unique)
        aggregates.append(f"quantile_disc({column}, [{fractions}]) FILTER (WHERE side = '{side}')")
        order.append((side, column, unique))
    inner = comparison.engine_sql("side, " + ", ".join(sorted({c for _, c in plan})))
    row = comparison.con.execute(f"SELECT {', '.join(aggregates)} FROM {inner}").fetchone()
    assert row is not None
    values: dict[tuple[str, str, int], float] = {}
    for (side, column, unique), result in zip(order, row, strict=True):
        for k, v in zip(unique, result or [], strict=False):
            values[(side, column, k)] = float(v)
    out: dict[tuple[str, str], QuantileEstimate] = {}
    for (side, key), (column, n, lower, upper, point) in spots.items():
        out[(side, key)] = QuantileEstimate(
            n,
            values[(side, column, point)],
            values[(side, column, lower)] if lower is not None else 0.0,
            values[(side, column, upper)] if upper is not None else math.inf,
        )
    return out


def _histogram_quantile(comparison: Comparison, need: QuantileNeed, signal: str) -> QuantileEstimate:
    delta = comparison.metrics.histogram(signal)[need.side]
    name = comparison.metrics.name_for(signal) or signal
    if delta is None:
        return QuantileEstimate(0, None, 0.0, math.inf, name)
    cs = histogram_quantile_cs(delta.bounds, delta.counts, need.quantile, need.alpha)
    if cs is None:
        return QuantileEstimate(0, None, 0.0, math.inf, name)
    lo, hi, estimate = cs
    return QuantileEstimate(delta.count, estimate, lo, hi, name)


def gather(
    con: duckdb.DuckDBPyConnection, selection: Selection, spec: CanarySpec
) -> tuple[SideStats, SideStats, list[str]]:
    """Resolve ``selection`` and summarise both sides for :func:`sre_agent.canary.judge`.

    Returns ``(baseline, candidate, notes)``.
    """
    baseline_w, candidate_w, notes = resolve_windows(con, selection)
    comparison = Comparison(con, selection, baseline_w, candidate_w, notes=notes)
    counts = _counts(comparison, spec)
    needs = spec.quantile_needs()
    sources = {m: _source(m, counts, comparison) for m in {n.metric for n in needs}}
    estimates = _span_quantiles(comparison, [n for n in needs if sources[n.metric] == "spans"], counts)
    for need in needs:
        if sources[need.metric] != "spans":
            estimates[(need.side, need.key)] = _histogram_quantile(comparison, need, sources[need.metric])
    for metric, source in sources.items():
        if source != "spans":
            notes.append(f"{metric} read from the {source} histogram (bucket edges widen its CI)")
    sides: list[SideStats] = []
    for window in (baseline_w, candidate_w):
        c = counts[window.side]
        quantiles = {key: est for (side, key), est in estimates.items() if side == window.side}
        sides.append(
            SideStats(
                requests=c["requests"],
                errors=c["errors"],
                good=c["good"] if spec.latency_slos else None,
                quantiles=quantiles,
                window=replace(window, requests=c["requests"]).describe(selection),
            )
        )
    return sides[0], sides[1], comparison.notes


def top_findings(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    limit: int,
    notes: list[str],
    budget_s: float | None = None,
) -> list[dict[str, Any]]:
    """The top diagnosis findings (CONTRACTS section 3 objects) for the same selection.

    Diagnosis is an explanation, not part of the verdict: if it fails, or
    takes longer than ``budget_s`` seconds (``None`` = :data:`FINDINGS_BUDGET_S`;
    its queries are then interrupted), the verdict still stands and a note says so. The budget
    keeps a controller's request (Argo's default timeout is 10 s) in time.
    """
    try:
        from sre_agent.diagnose import diagnose
    except ImportError:
        notes.append("diagnosis unavailable in this build; no findings attached")
        return []
    budget_s = FINDINGS_BUDGET_S if budget_s is None else budget_s
    cursor = con.cursor()  # its own cursor, so it can be interrupted without touching the caller's
    found: list[dict[str, Any]] = []
    failure: list[str] = []
    done = threading.Event()
    abandoned = threading.Event()

    def work() -> None:
        try:
            report = diagnose(cursor, selection, sample_per_side=FINDINGS_SAMPLE_PER_SIDE)
            found.extend(dict(f) for f in report.to_dict().get("findings", [])[:limit])
        except Exception as exc:  # boundary: an explanation must never break the gate
            if not abandoned.is_set():
                log.exception("diagnosis for the canary verdict failed")
                failure.append(f"{type(exc).__name__}: {exc}")
        finally:
            done.set()

    worker = threading.Thread(target=work, name="sre-agent-canary-findings", daemon=True)
    worker.start()
    if not done.wait(budget_s):
        abandoned.set()
        cursor.interrupt()
        done.wait(2.0)
        notes.append(
            f"diagnosis did not finish within {budget_s:g} s; verdict given without findings "
            "(run `sre-agent diagnose` with the same selection)"
        )
        found.clear()
    elif failure:
        notes.append(f"diagnosis failed ({failure[0]}); verdict given without findings")
    if done.is_set():
        cursor.close()
    return found
