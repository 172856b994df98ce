"""Store side of the canary gate: two SQL scans turn a comparison into :class:`SideStats`.

The populations come from :mod:`sre_agent.analysis.compare` (the same resolution
``diagnose`` uses, including derived latencies). Only summaries travel into
Python: per-side counts, and the handful of exact order statistics each
confidence sequence needs (``quantile_disc`` at chosen ranks), so one verdict
on millions of spans stays well under a second.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from sre_agent.analysis.attribute_keys import filter_sql
from sre_agent.analysis.compare import SIDES, Comparison, SideWindow, resolve_windows
from sre_agent.analysis.exceedance import DENSITY_WINDOW, TIME_BLOCKS, ShareCounts
from sre_agent.canary.sequential import histogram_quantile_cs, point_rank
from sre_agent.canary.verdict import CanarySpec, QuantileEstimate, QuantileNeed, SideStats, ladder_ranks
from sre_agent.errors import EmptySelectionError

if TYPE_CHECKING:
    import duckdb

    from sre_agent.analysis.selection import Selection

__all__ = ["gather", "top_findings", "unknown_names"]

log = logging.getLogger(__name__)

#: SLO metric -> engine-span column (after compare's derivations).
SPAN_COLUMN: Final[dict[str, str]] = {
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "itl": "tpot_s",
    "e2e": "e2e_s",
    "queue": "queue_s",
}
#: SLO metric -> histogram signal (sre_agent.store.schema.METRIC_SIGNALS).
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


def _valid(column: str) -> str:
    """NULL for malformed latencies (negative, NaN, infinite), as compare does."""
    return f"CASE WHEN {column} >= 0 AND isfinite({column}) THEN {column} END"


# A row where compare.engine_sql would fill a latency the store lacks (TTFT from queue + prefill,
# e2e from the span duration, TPOT from decode time). Without such rows the stored, validated
# columns *are* the derived ones, and the verdict scans them directly (derivations cost more
# than the verdict itself on millions of spans); with any, it scans engine_sql.
_FILLABLE = (
    f"({_valid('ttft_s')} IS NULL AND {_valid('queue_s')} + {_valid('prefill_s')} IS NOT NULL) OR "
    f"({_valid('e2e_s')} IS NULL AND {_valid('duration_s')} IS NOT NULL) OR "
    f"({_valid('tpot_s')} IS NULL AND output_tokens > 1)"
)


class _Sources:
    """The two ways to read the selected engine spans: columns ``side``, ``slice`` and the latencies.

    ``slice`` (0..19) is the request's time block within its side's window,
    over which a share's variance is estimated (:mod:`sre_agent.analysis.exceedance`).
    """

    def __init__(self, comparison: Comparison, windows: tuple[SideWindow, SideWindow]) -> None:
        b, c = windows
        self.comparison = comparison
        self.side = f"CASE WHEN {b.predicate()} THEN 'baseline' WHEN {c.predicate()} THEN 'candidate' END"
        self.where = f"is_engine AND ({b.predicate()} OR {c.predicate()}) AND {filter_sql(comparison.selection)}"
        k = TIME_BLOCKS
        self.slice = (
            f"least({k - 1}, CAST(floor(CASE side WHEN 'baseline' THEN (start_ns - {b.start_ns}) * {k}.0 / "
            f"{max(1, b.end_ns - b.start_ns)} ELSE (start_ns - {c.start_ns}) * {k}.0 / "
            f"{max(1, c.end_ns - c.start_ns)} END) AS INTEGER))"
        )

    def predicted_counts(self) -> dict[str, dict[str, int]]:
        """side -> stored non-null values per latency column (a cheap scan): the expected counts."""
        columns = sorted(set(SPAN_COLUMN.values()))
        rows = self.comparison.con.execute(
            f"SELECT {self.side}, {', '.join(f'count({col})' for col in columns)} FROM {self.comparison.scan} "
            f"WHERE {self.where} GROUP BY 1"
        ).fetchall()
        out: dict[str, dict[str, int]] = {s: dict.fromkeys((f"n_{col}" for col in columns), 0) for s in SIDES}
        for row in rows:
            if row[0] is not None:
                out[row[0]] = {f"n_{col}": int(v) for col, v in zip(columns, row[1:], strict=True)}
        return out

    def stored(self) -> str:
        """The stored latencies, validated, plus a ``fillable`` flag (see ``_FILLABLE``)."""
        validated = ", ".join(f"{_valid(col)} AS {col}" for col in sorted(set(SPAN_COLUMN.values())))
        inner = (
            f"SELECT {self.side} AS side, start_ns, status_code, error_type, {validated}, ({_FILLABLE}) AS fillable "
            f"FROM {self.comparison.scan} WHERE {self.where}"
        )
        return f"(SELECT *, {self.slice} AS slice FROM ({inner}))"

    def derived(self) -> str:
        """compare's derived engine spans, with a constant ``fillable = false``."""
        inner = self.comparison.engine_sql(
            "side, start_ns, status_code, error_type, ttft_s, tpot_s, e2e_s, queue_s, FALSE AS fillable"
        )
        return f"(SELECT *, {self.slice} AS slice FROM {inner})"


class _Plan:
    """The order statistics a set of needs asks for, given each side's (expected) value counts.

    For each need: the point estimate and the ladder's order statistics (see
    :func:`sre_agent.canary.verdict.ladder_ranks`). Both sides share one
    ``quantile_disc`` fraction list per column (the union of theirs), so a
    single ``GROUP BY side`` answers them all; each side then reads only its
    own fractions.
    """

    def __init__(self, needs: list[QuantileNeed], counts: dict[str, dict[str, int]]) -> None:
        self.counts = counts
        ranks: dict[str, set[tuple[str, int]]] = {}  # column -> {(side, rank)}
        self.spots: dict[tuple[str, str], tuple[str, int, int, list[tuple[float, int | None, int | None]]]] = {}
        for need in needs:
            column = SPAN_COLUMN[need.metric]
            n = counts[need.side][f"n_{column}"]
            if n == 0:
                continue
            point = point_rank(n, need.quantile)
            ladder = ladder_ranks(n, need.quantile)
            wanted = {point} | {r for _, lo, hi in ladder for r in (lo, hi) if r is not None}
            ranks.setdefault(column, set()).update((need.side, r) for r in wanted)
            self.spots[(need.side, need.key)] = (column, n, point, ladder)
        self.order = [(column, sorted(r)) for column, r in sorted(ranks.items())]

    def aggregates(self) -> list[str]:
        """One ``quantile_disc`` per column; ``(k - 0.5) / n`` is exactly the k-th order statistic."""
        out = []
        for column, wanted in self.order:
            fractions = ", ".join(repr((k - 0.5) / self.counts[side][f"n_{column}"]) for side, k in wanted)
            out.append(f"quantile_disc({column}, [{fractions}])")
        return out

    def found(
        self, results: dict[str, tuple[Any, ...]], exact: dict[str, dict[str, int]]
    ) -> dict[tuple[str, str], QuantileEstimate | None]:
        """(side, need key) -> estimate, or ``None`` where the expected count was wrong."""
        values: dict[tuple[str, str, int], float] = {}
        for side, row in results.items():
            for (column, wanted), result in zip(self.order, row, strict=True):
                for (want_side, k), v in zip(wanted, result or [], strict=False):
                    if want_side == side:
                        values[(side, column, k)] = float(v)
        out: dict[tuple[str, str], QuantileEstimate | None] = {}
        for (side, key), (column, n, point, ladder) in self.spots.items():
            if exact[side][f"n_{column}"] != n:
                out[(side, key)] = None
                continue
            rungs = tuple(
                (
                    offset,
                    values[(side, column, lo)] if lo is not None else 0.0,
                    values[(side, column, hi)] if hi is not None else math.inf,
                )
                for offset, lo, hi in ladder
            )
            out[(side, key)] = QuantileEstimate(n, values[(side, column, point)], ladder=rungs)
        return out


def _good_sql(spec: CanarySpec) -> str:
    good = [f"NOT {_ERROR}"]
    for s in spec.latency_slos:
        assert s.metric is not None
        good.append(f"coalesce({SPAN_COLUMN[s.metric]} <= {float(s.threshold)!r}, TRUE)")
    return " AND ".join(good)


def _scan(
    con: duckdb.DuckDBPyConnection, spec: CanarySpec, plan: _Plan, source: str
) -> tuple[dict[str, dict[str, int]], dict[tuple[str, str], QuantileEstimate | None], bool]:
    """One ``GROUP BY side`` scan: per-side counts, the plan's order statistics, and whether any row was fillable."""
    columns = sorted(set(SPAN_COLUMN.values()))
    names = ["requests", "errors", "good", *(f"n_{c}" for c in columns)]
    selects = [
        "count(*)",
        f"count(*) FILTER (WHERE {_ERROR})",
        f"count(*) FILTER (WHERE {_good_sql(spec)})",
        *(f"count({c})" for c in columns),
        "bool_or(fillable)",
        *plan.aggregates(),
    ]
    sql = f"SELECT side, {', '.join(selects)} FROM {source} WHERE side IS NOT NULL GROUP BY side"
    rows = con.execute(sql).fetchall()
    counts: dict[str, dict[str, int]] = {side: dict.fromkeys(names, 0) for side in SIDES}
    results: dict[str, tuple[Any, ...]] = {}
    fillable = False
    for row in rows:
        counts[row[0]] = {name: int(v or 0) for name, v in zip(names, row[1:], strict=False)}
        fillable = fillable or bool(row[1 + len(names)])
        results[row[0]] = tuple(row[2 + len(names) :])
    return counts, plan.found(results, counts), fillable


def _thresholds(
    spec: CanarySpec, found: dict[tuple[str, str], QuantileEstimate], span_keys: set[str]
) -> dict[tuple[str, str], tuple[str, float]]:
    """(side, check key) -> (column, threshold) of every share a span-read check counts per time block."""
    out: dict[tuple[str, str], tuple[str, float]] = {}
    for s in spec.latency_slos:
        key = f"slo:{s.name}"
        if key in span_keys:
            assert s.metric is not None
            out[("candidate", key)] = out[("baseline", key)] = (SPAN_COLUMN[s.metric], s.threshold)
    for r in spec.regressions:
        key = f"reg:{r.name}"
        for side in SIDES:
            own = found.get((side, key))
            if key in span_keys and own is not None and own.estimate is not None:
                out[(side, key)] = (SPAN_COLUMN[r.metric], own.estimate)
    return out


def _block_counts(
    con: duckdb.DuckDBPyConnection,
    spec: CanarySpec,
    source: str,
    thresholds: dict[tuple[str, str], tuple[str, float]],
) -> dict[tuple[str, str], ShareCounts]:
    """Bad requests per time block, per (side, check key), from one ``GROUP BY side, slice`` scan.

    Mirrors :func:`sre_agent.canary.verdict.summarise` exactly (values above the
    threshold; within :data:`DENSITY_WINDOW` below it, inclusive, and above it).
    """
    keys = sorted({key for _, key in thresholds})
    selects = ["count(*)", f"count(*) FILTER (WHERE {_ERROR})", f"count(*) FILTER (WHERE NOT ({_good_sql(spec)}))"]
    for key in keys:
        column = next(col for (_, k), (col, _) in thresholds.items() if k == key)

        def per_side(value: Callable[[float], str], key: str = key) -> str:
            arms = " ".join(f"WHEN '{side}' THEN {value(thresholds[(side, key)][1])}"
                            for side in SIDES if (side, key) in thresholds)  # fmt: skip
            return f"CASE side {arms} END"

        threshold = per_side(repr)
        lo = per_side(lambda t: repr(t / (1.0 + DENSITY_WINDOW)))
        hi = per_side(lambda t: repr(t * (1.0 + DENSITY_WINDOW)))
        selects += [
            f"count({column})",
            f"count(*) FILTER (WHERE {column} > {threshold})",
            f"count(*) FILTER (WHERE {column} BETWEEN {lo} AND {threshold})",
            f"count(*) FILTER (WHERE {column} > {threshold} AND {column} <= {hi})",
        ]
    rows = con.execute(f"SELECT side, slice, {', '.join(selects)} FROM {source} GROUP BY side, slice").fetchall()
    out: dict[tuple[str, str], ShareCounts] = {}
    for side in SIDES:
        blocks: dict[int, tuple[Any, ...]] = {int(row[1]): row[2:] for row in rows if row[0] == side}
        for s in spec.slos:
            if s.kind != "quantile":
                out[(side, f"slo:{s.name}")] = _counts(blocks, 0, 1 if s.kind == "error_rate" else 2)
        for i, key in enumerate(keys):
            if (side, key) in thresholds:
                out[(side, key)] = _counts(blocks, 3 + 4 * i, 4 + 4 * i, 5 + 4 * i)
    return out


def _counts(blocks: dict[int, tuple[Any, ...]], size: int, hit: int, near: int | None = None) -> ShareCounts:
    """Columns ``size``/``hit`` (and ``near``, ``near + 1``) of per-block rows as :class:`ShareCounts`."""
    sizes = tuple(int(blocks[k][size]) if k in blocks else 0 for k in range(TIME_BLOCKS))
    hits = tuple(int(blocks[k][hit]) if k in blocks else 0 for k in range(TIME_BLOCKS))
    if near is None:
        return ShareCounts(sizes, hits)
    below = sum(int(b[near]) for b in blocks.values())
    above = sum(int(b[near + 1]) for b in blocks.values())
    return ShareCounts(sizes, hits, below, above)


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


def _histogram_quantile(comparison: Comparison, need: QuantileNeed, signal: str) -> QuantileEstimate:
    delta = comparison.metrics.histogram(signal)[need.side]
    name = comparison.metrics.name_for(signal) or signal
    if delta is None:
        return QuantileEstimate(0, None, source=name)
    cs = histogram_quantile_cs(delta.bounds, delta.counts, need.quantile, need.alpha)
    if cs is None:
        return QuantileEstimate(0, None, source=name)
    lo, hi, estimate = cs
    return QuantileEstimate(delta.count, estimate, lo, hi, name)


def unknown_names(con: duckdb.DuckDBPyConnection, selection: Selection) -> str | None:
    """Why a version pair names a ``service.version`` the store has never seen, or ``None``.

    An unknown ``--service`` needs no check here: resolving the windows
    already raises :class:`~sre_agent.errors.EmptySelectionError` for it.
    """
    if selection.mode != "versions":
        return None
    for version in (selection.baseline_version, selection.candidate_version):
        row = con.execute("SELECT EXISTS (SELECT 1 FROM spans WHERE service_version = ?)", [version]).fetchone()
        if row != (True,):
            present = [r[0] for r in con.execute(
                "SELECT DISTINCT service_version FROM spans WHERE service_version IS NOT NULL ORDER BY 1 LIMIT 20"
            ).fetchall()]  # fmt: skip
            return (
                f"no spans with service.version={version!r} in the store "
                f"(versions present: {', '.join(present) or 'none'})"
            )
    return None


def gather(
    con: duckdb.DuckDBPyConnection, selection: Selection, spec: CanarySpec
) -> tuple[SideStats, SideStats, list[str]]:
    """Resolve ``selection`` and summarise both sides for :func:`sre_agent.canary.verdict.judge`.

    Returns ``(baseline, candidate, notes)``.
    """
    baseline_w, candidate_w, notes, _ = resolve_windows(con, selection)
    comparison = Comparison(con, selection, baseline_w, candidate_w, notes=notes)
    sources = _Sources(comparison, (baseline_w, candidate_w))
    expected = sources.predicted_counts()
    needs = spec.quantile_needs()
    metric_source = {m: _source(m, expected, comparison) for m in {n.metric for n in needs}}
    span_needs = [n for n in needs if metric_source[n.metric] == "spans"]
    source = sources.stored()
    counts, found, fillable = _scan(con, spec, _Plan(span_needs, expected), source)
    if fillable:  # some latency must be derived: read compare's derived spans instead
        source = sources.derived()
        counts, found, _ = _scan(con, spec, _Plan(span_needs, expected), source)
    missed = [n for n in span_needs if found.get((n.side, n.key)) is None]
    if missed:  # the expected counts were off (malformed or derived values): ask again with the exact ones
        _, again, _ = _scan(con, spec, _Plan(missed, counts), source)
        found.update(again)
    if selection.where and not counts["baseline"]["requests"] and not counts["candidate"]["requests"]:
        raise EmptySelectionError(comparison.empty_filter_message(dict.fromkeys(SIDES, 0)))
    complete = {k: v for k, v in found.items() if v is not None}
    histograms = {
        (n.side, n.key): _histogram_quantile(comparison, n, metric_source[n.metric])
        for n in needs
        if metric_source[n.metric] != "spans"
    }
    for metric, origin in metric_source.items():
        if origin != "spans":
            notes.append(f"{metric} read from the {origin} histogram (bucket edges widen its CI)")
    span_keys = {n.key for n in span_needs}
    shares = _block_counts(con, spec, source, _thresholds(spec, complete, span_keys))
    out = []
    for window in (baseline_w, candidate_w):
        c = counts[window.side]
        quantiles = {key: q for (side, key), q in complete.items() if side == window.side}
        quantiles.update({key: q for (side, key), q in histograms.items() if side == window.side})
        out.append(
            SideStats(
                requests=c["requests"],
                errors=c["errors"],
                good=c["good"] if spec.latency_slos else None,
                quantiles=quantiles,
                shares={key: v for (side, key), v in shares.items() if side == window.side},
                window=replace(window, requests=c["requests"]).describe(selection),
            )
        )
    return out[0], out[1], comparison.notes


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
        from sre_agent.analysis.diagnosis import diagnose
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
