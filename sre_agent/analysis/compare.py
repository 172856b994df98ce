"""Resolve a Selection into a baseline and a candidate population.

:meth:`Comparison.open` turns what the user asked for (a deploy time, a
version pair, explicit windows, the last deploy; plus ``--service`` and
``--where`` filters) into two concrete windows over the store's engine
request spans (``is_engine``). Rules then read, through the same object:

* **histograms**: one DuckDB scan builds per-side, per-time-slice log-bucket
  histograms of every latency column (exact over all rows); quantiles and
  CIs over time blocks come from them (:mod:`sre_agent.analysis.stats`);
* **requests**: one hash-sampled frame of at most ``sample_per_side``
  requests per side, with every low-cardinality attribute flattened into a
  column, for mix reweighting and slice localisation;
* **traces**: per sampled request, the root span, gateway and dependency
  time of its trace (only when the window holds non-engine spans);
* **spans**: non-engine span groups (service, name, kind) with quantiles;
* **metrics**: the metric stream per side (:class:`MetricView`).

Everything is computed lazily and cached, so a rule pays only for what it
uses and every rule shares the same few scans.
"""

from __future__ import annotations

import math
import uuid
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from sre_agent.analysis import stats
from sre_agent.analysis.attribute_keys import (
    MAX_DIMENSION_VALUES,
    discover_dimensions,
    filter_sql,
    key_sql,
    metric_key_sql,
)
from sre_agent.analysis.busy import BusyIntervals, Prefetch
from sre_agent.analysis.compare_traces import TraceAggregates
from sre_agent.analysis.metric_view import MetricView, fetch_one
from sre_agent.analysis.resolve import (
    E2E_SQL,
    QUEUE_SQL,
    SIDES,
    DeployPoint,
    Side,
    SideWindow,
    Windows,
    describe_where,
    log_bucket_sql,
    resolve_windows,
    scan_relation,
    service_sql,
    slice_position_sql,
    valid_latency_sql,
)
from sre_agent.analysis.rules_api import SidePair
from sre_agent.analysis.selection import Selection, format_time
from sre_agent.errors import EmptySelectionError, InsufficientDataError
from sre_agent.store.sql_text import ident, literal

if TYPE_CHECKING:
    import duckdb
    import polars as pl

__all__ = [
    "E2E_SQL",
    "LATENCIES",
    "QUEUE_SQL",
    "SIDES",
    "Comparison",
    "DeployPoint",
    "Side",
    "SideWindow",
    "Windows",
    "resolve_windows",
]


#: Report name -> canonical column (after derivation of missing values).
LATENCIES: Final[dict[str, str]] = {
    "e2e": "e2e_s",
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "queue": "queue_s",
    "prefill": "prefill_s",
    "decode": "decode_s",
}


class Comparison(TraceAggregates):
    """Baseline and candidate populations plus the shared aggregates rules read.

    Build with :meth:`open`. All expensive members are computed on first use
    and cached; the DuckDB connection must stay open while the object is used.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        selection: Selection,
        baseline: SideWindow,
        candidate: SideWindow,
        *,
        notes: list[str] | None = None,
        slices: int = 40,
        sample_per_side: int = 50_000,
        seed: int = 0,
    ) -> None:
        self.con = con
        # The relation large scans of the selected spans read (resolve.scan_relation).
        self.scan = scan_relation(con)
        self.selection = selection
        self.notes: list[str] = list(notes or [])
        self.slices = slices
        self.sample_per_side = sample_per_side
        self.seed = seed
        self._windows: dict[str, SideWindow] = {"baseline": baseline, "candidate": candidate}
        self._tag = uuid.uuid4().hex[:10]
        self._hist_cache: dict[tuple[str, str], stats.SliceHistogram] = {}
        self._dimensions: list[str] = []
        self._dimension_maps: dict[str, tuple[str, ...]] = {}
        self._trace_cache: pl.DataFrame | None = None
        self._prefetch: Prefetch | None = None

    @classmethod
    def open(
        cls,
        con: duckdb.DuckDBPyConnection,
        selection: Selection,
        *,
        slices: int = 40,
        sample_per_side: int = 50_000,
        seed: int = 0,
    ) -> Comparison:
        """Resolve ``selection`` against ``con`` (tables ``spans``, ``metric_points``, ``deploys``).

        Raises :class:`SelectionError` when the selection cannot be resolved
        and :class:`InsufficientDataError` when neither spans nor metrics give
        either side any data.
        """
        # DuckDB draws a progress bar on stderr for long queries; it would corrupt terminal output.
        con.execute("SET enable_progress_bar = false")
        baseline, candidate, notes, _ = resolve_windows(con, selection)
        comparison = cls(
            con, selection, baseline, candidate, notes=notes, slices=slices, sample_per_side=sample_per_side, seed=seed
        )
        comparison._check_data()
        return comparison

    # ------------------------------------------------------------ busy intervals
    def start_prefetch(self) -> bool:
        """Start reading :attr:`busy_intervals` on a second connection; returns whether it started.

        Worth it when the engine rules will run: the read is the costliest step
        at millions of spans and releases the GIL. Pair with :meth:`cancel_prefetch`.
        """
        if self._prefetch is None:
            self._prefetch = Prefetch(self)
            return self._prefetch.start()
        return False

    def cancel_prefetch(self) -> None:
        """Interrupt a background read that is still running (nothing needed it)."""
        if self._prefetch is not None:
            self._prefetch.cancel()

    @cached_property
    def busy_intervals(self) -> BusyIntervals:
        """Every selected engine request's busy interval per replica (:mod:`sre_agent.analysis.busy`)."""
        return (self._prefetch or Prefetch(self)).result()

    # ----------------------------------------------------------------- windows
    @property
    def bounds(self) -> tuple[int, int]:
        """Earliest start and latest end of the two windows, Unix epoch ns (known before any scan)."""
        return min(w.start_ns for w in self._windows.values()), max(w.end_ns for w in self._windows.values())

    def window(self, side: Side) -> SideWindow:
        """One side's window with its request count filled in."""
        w = self._windows[side]
        return SideWindow(w.side, w.start_ns, w.end_ns, w.version, self.request_counts[side])

    @property
    def windows(self) -> dict[str, tuple[int, int, float, int]]:
        """side -> (start_ns, end_ns, seconds, requests)."""
        return {s: (w.start_ns, w.end_ns, w.seconds, w.requests) for s in SIDES for w in [self.window(s)]}

    @property
    def arrival_rate(self) -> SidePair:
        """Engine requests per second on each side (all rows)."""
        b, c = self.window("baseline"), self.window("candidate")
        return SidePair(b.requests / b.seconds, c.requests / c.seconds)

    @cached_property
    def arrival_change_z(self) -> float | None:
        """z of the change in engine requests per second, against the spread of per-slice counts.

        Arrivals are bursty (Azure's code trace has a coefficient of variation of ~13 at
        one-second resolution), so a Poisson standard error (sqrt n) calls chance bursts a
        load change. Here each side's rate is the mean of its :attr:`slices` per-slice rates
        (all rows, empty slices included) and its variance that mean's sampling variance, so
        over-dispersion is measured rather than assumed. ``None`` without requests on a side.
        """
        moments: list[tuple[float, float]] = []
        for s in SIDES:
            w = self._windows[s]
            per_slice = self._aggregate[0][s].counts.sum(axis=1).astype(float)
            if per_slice.sum() <= 0 or w.seconds <= 0:
                return None
            counts = np.concatenate([per_slice, np.zeros(max(0, self.slices - per_slice.size))])
            moments.append(stats.rate_moments(counts, w.seconds))
        (mb, vb), (mc, vc) = moments
        se = math.sqrt(vb + vc)
        return (mc - mb) / se if se > 0 else None

    def _slice_sql(self) -> str:
        b, c = self._windows["baseline"], self._windows["candidate"]
        k = self.slices
        return (
            f"CAST(floor((start_ns - CASE side WHEN 'baseline' THEN {b.start_ns} ELSE {c.start_ns} END) * {k}.0 "
            f"/ CASE side WHEN 'baseline' THEN {b.end_ns - b.start_ns} ELSE {c.end_ns - c.start_ns} END) AS INTEGER)"
        )

    def _scope_sql(self, sampled: bool = False) -> str:
        """WHERE clause for the selected engine spans; ``sampled`` keeps only the sampled sub-windows."""
        b, c = self._windows["baseline"], self._windows["candidate"]
        sides = []
        for w in (b, c):
            pred = w.predicate()
            period = self.sample_period(w.side) if sampled else None
            if period is not None:
                # Keep the first `fraction` of every slice: contiguous runs let DuckDB skip the
                # attribute maps of unsampled vectors (hashing every row would decode them all).
                keep = max(1, int(period * self._sample_fraction[w.side]))
                pred += f" AND (start_ns - {w.start_ns}) % {period} < {keep}"
            sides.append(f"({pred})")
        return f"is_engine AND ({' OR '.join(sides)}) AND {filter_sql(self.selection)}"

    def scan_sql(self, select: str, where: str = "TRUE") -> str:
        """A query over the selected engine spans of both sides, straight on the table.

        Cheaper than :meth:`engine_sql` over millions of rows: no side, slice or
        derived columns. ``select`` may use :data:`QUEUE_SQL` and :data:`E2E_SQL`
        for the cleaned queue and e2e seconds.
        """
        return f"SELECT {select} FROM {self.scan} WHERE {self._scope_sql()} AND ({where})"

    def engine_sql(self, columns: str = "*", *, sampled: bool = False) -> str:
        """A subquery over the selected engine spans of both sides with derived latencies.

        Columns: every canonical column (latencies cleaned and derived: a
        missing TTFT is queue + prefill, a missing e2e the span duration,
        and so on), plus ``side`` ('baseline'|'candidate') and ``slice``
        (0..slices-1, the time block). ``columns`` selects from it;
        ``sampled`` restricts it to the rows of :attr:`requests`.
        """
        b, c = self._windows["baseline"], self._windows["candidate"]
        queue, e2e = QUEUE_SQL, E2E_SQL
        prefill0, decode0 = valid_latency_sql("prefill_s"), valid_latency_sql("decode_s")
        ttft = f"coalesce({valid_latency_sql('ttft_s')}, {queue} + {prefill0})"
        inner = f"""
            SELECT *,
              CASE WHEN {b.predicate()} THEN 'baseline' WHEN {c.predicate()} THEN 'candidate' END AS side,
              {queue} AS q_s, {ttft} AS t_s, {e2e} AS e_s, {prefill0} AS p_s, {decode0} AS d_s,
              coalesce(e2e_s < 0 OR isnan(e2e_s) OR ttft_s < 0 OR isnan(ttft_s) OR queue_s < 0 OR isnan(queue_s),
                       false) AS malformed
            FROM {self.scan} WHERE {self._scope_sql(sampled)}
        """
        derived = f"""
            SELECT * EXCLUDE (queue_s, ttft_s, e2e_s, prefill_s, decode_s, tpot_s, q_s, t_s, e_s, p_s, d_s),
              q_s AS queue_s, t_s AS ttft_s, e_s AS e2e_s,
              coalesce(p_s, CASE WHEN t_s >= q_s THEN t_s - q_s END) AS prefill_s,
              coalesce(d_s, CASE WHEN e_s >= t_s THEN e_s - t_s END) AS decode_s,
              coalesce({valid_latency_sql("tpot_s")},
                       CASE WHEN output_tokens > 1 THEN coalesce(d_s, e_s - t_s) / (output_tokens - 1) END) AS tpot_s,
              {self._slice_sql()} AS slice
            FROM ({inner}) WHERE side IS NOT NULL
        """
        return f"(SELECT {columns} FROM ({derived}))"

    # ------------------------------------------------------------ aggregates
    @cached_property
    def _aggregate(self) -> tuple[dict[str, stats.SliceHistogram], dict[str, int], dict[str, int]]:
        """One scan over all selected rows: per side/slice e2e histogram, counts, unusable rows.

        Only e2e is binned over every row (the headline, exact to ~0.5 %); the
        other latencies come from the sample, because each extra column binned
        over millions of rows costs as much as the whole scan. The scan's
        expressions are kept to the bare minimum (every CASE per row costs
        ~10 % of a bare quantile): when the two windows are adjacent and equally
        long (a deploy time), side and slice come from one integer division;
        rows without a usable e2e are re-read from their span duration in a
        second, selective query.
        """
        b, c = self._windows["baseline"], self._windows["candidate"]
        k = self.slices
        adjacent = b.end_ns == c.start_ns and b.seconds == c.seconds and b.version is None and c.version is None
        if adjacent:
            # global slice g in [0, 2k): baseline slices 0..k-1, candidate k..2k-1
            where = f"is_engine AND start_ns >= {b.start_ns} AND start_ns < {c.end_ns} AND {filter_sql(self.selection)}"
            position = f"(start_ns - {b.start_ns}) * {2 * k} // {c.end_ns - b.start_ns}"
        else:
            where = self._scope_sql()
            position = slice_position_sql(b, c, k)
        sql = (
            "SELECT {pos} AS g, {bkt} AS bucket, count(*) AS n FROM "
            + self.scan
            + " WHERE {where} {extra} GROUP BY ALL"
        )
        rows = self.con.sql(sql.format(pos=position, bkt=log_bucket_sql("e2e_s"), where=where, extra="")).fetchnumpy()
        g, buckets, n = _ints(rows["g"]), rows["bucket"], _ints(rows["n"])
        missing = _isnull(buckets)
        if missing.any():
            # e2e absent or malformed on some rows: fall back to the span's own duration for those
            fallback = self.con.sql(
                sql.format(
                    pos=position,
                    bkt=log_bucket_sql("duration_s"),
                    where=where,
                    extra="AND NOT coalesce(e2e_s >= 0 AND isfinite(e2e_s), false)",
                )
            ).fetchnumpy()
            g = np.concatenate([g[~missing], _ints(fallback["g"])])
            n = np.concatenate([n[~missing], _ints(fallback["n"])])
            buckets = np.concatenate(
                [_ints(rows["bucket"][~missing]), np.ma.filled(fallback["bucket"], np.iinfo(np.int64).min)]
            )
            missing = buckets == np.iinfo(np.int64).min
        buckets = np.ma.filled(buckets, np.iinfo(np.int64).min).astype(np.int64)
        valid_g = (g >= 0) & (g < 2 * k)
        hists: dict[str, stats.SliceHistogram] = {}
        counts: dict[str, int] = {}
        bad: dict[str, int] = {}
        for i, s in enumerate(SIDES):
            mask = valid_g & (g // k == i)
            counts[s] = int(n[mask].sum())
            bad[s] = int(n[mask & missing].sum())
            keep = mask & ~missing
            hists[s] = stats.SliceHistogram.from_long(g[keep] - i * k, buckets[keep], n[keep])
        return hists, counts, bad

    @property
    def request_counts(self) -> dict[str, int]:
        """Engine requests per side (all rows)."""
        return self._aggregate[1]

    @cached_property
    def _sample_fraction(self) -> dict[Side, float]:
        counts = self.request_counts
        return {s: min(1.0, self.sample_per_side / counts[s]) if counts[s] else 1.0 for s in SIDES}

    @property
    def sample_fraction(self) -> dict[Side, float]:
        """Share of each side's requests kept in :attr:`requests` (1.0 = every request)."""
        return dict(self._sample_fraction)

    def sample_period(self, side: Side) -> int | None:
        """Period (ns) of the sample's runs on ``side``; ``None`` when every request is kept.

        A sampled side keeps the requests that start in the leading
        :attr:`sample_fraction` of each period ``[start + k * period, start + (k + 1) * period)``
        of its window (``start`` = the window start, ``k`` = 0 .. slices - 1).
        """
        if self._sample_fraction[side] >= 1.0:
            return None
        w = self._windows[side]
        return max(1, (w.end_ns - w.start_ns) // self.slices)

    def window_seconds(self) -> dict[str, float]:
        """Window length per side, seconds."""
        return {s: self._windows[s].seconds for s in SIDES}

    def scaled_counts(self, frame: pl.DataFrame) -> dict[str, int]:
        """Requests per side that a subset of :attr:`requests` stands for (sample counts / fraction)."""
        counts = {r["side"]: int(r["len"]) for r in frame.group_by("side").len().to_dicts()}
        return {s: round(counts.get(s, 0) / self._sample_fraction[s]) for s in SIDES}

    @property
    def sampled(self) -> bool:
        """Whether :attr:`requests` is a sample rather than every selected request."""
        return any(f < 1.0 for f in self._sample_fraction.values())

    def histogram(self, side: Side, metric: str) -> stats.SliceHistogram:
        """Per-slice log-bucket histogram of ``metric`` (a key of :data:`LATENCIES`, or ``trace``).

        e2e is exact over every row; the others come from :attr:`requests`
        (``trace`` is the root span's duration, what the gateway's client saw).
        Empty when there is no data.
        """
        if metric == "e2e":
            return self._aggregate[0][side]
        key = (side, metric)
        if key not in self._hist_cache:
            import polars as pl

            col = LATENCIES.get(metric, f"{metric}_s")
            if col not in self.requests.columns:
                return stats.SliceHistogram.from_long([], [], [])
            # Narrow before filtering: a filter copies every column of the ~30-column sample.
            frame = self.requests.select("side", "slice", col).filter(
                (pl.col("side") == side) & pl.col(col).is_not_null()
            )
            self._hist_cache[key] = stats.SliceHistogram.from_values(frame["slice"].to_numpy(), frame[col].to_numpy())
        return self._hist_cache[key]

    def _check_data(self) -> None:
        counts = self.request_counts
        bad = self._aggregate[2]
        for side in SIDES:
            if bad[side]:
                self.notes.append(f"{bad[side]} {side} engine spans had no usable e2e latency and were ignored")

        if self.selection.where:
            for side in SIDES:
                if counts[side] == 0 and not self.metrics.has_latency_histograms(side):
                    raise EmptySelectionError(self.empty_filter_message(counts))
        if counts["baseline"] == 0 and counts["candidate"] == 0 and not self.metrics.has_latency_histograms():
            b, c = self.window("baseline"), self.window("candidate")
            raise InsufficientDataError(
                f"no engine requests and no latency metrics in either window "
                f"(baseline {format_time(b.start_ns)}..{format_time(b.end_ns)}, "
                f"candidate {format_time(c.start_ns)}..{format_time(c.end_ns)})"
            )
        for side in SIDES:
            if counts[side] == 0 and not self.metrics.has_latency_histograms(side):
                w = self.window(side)
                raise InsufficientDataError(
                    f"the {side} window {format_time(w.start_ns)}..{format_time(w.end_ns)} holds no engine requests "
                    "and no latency metrics: nothing to compare it with; widen or move the window"
                )
            if 0 < counts[side] < stats.MIN_REQUESTS:
                self.notes.append(f"only {counts[side]} {side} requests: estimates are unreliable")
            elif counts[side] == 0:
                self.notes.append(f"no {side} engine requests: span-based rules cannot run")

    def empty_filter_message(self, counts: dict[str, int]) -> str:
        """Which ``--where`` filter left a side empty, with the values the windows do hold."""
        where = " OR ".join(f"({self._windows[s].predicate()})" for s in SIDES)
        where = f"is_engine AND {service_sql(self.selection)} AND ({where})"
        hints = []
        for key, _ in self.selection.where:
            values = self.con.execute(
                f"SELECT v FROM (SELECT {key_sql(key)} AS v FROM {self.scan} WHERE {where}) "
                "WHERE v IS NOT NULL GROUP BY v ORDER BY count(*) DESC LIMIT 10"
            ).fetchall()
            hints.append(f"{key} values there: {', '.join(str(v[0]) for v in values) or 'none'}")
        b, c = counts["baseline"], counts["candidate"]
        if b or c:
            side = "baseline" if b == 0 else "candidate"
            scope = f"no {side} engine request ({b} baseline, {c} candidate)"
        else:
            scope = "no engine request in either window"
        return f"{describe_where(self.selection)} matches {scope}; {'; '.join(hints)}"

    def quality_notes(self) -> list[str]:
        """Notes on malformed rows (negative or NaN latencies), counted on :attr:`requests`."""
        import polars as pl

        frame = self.requests
        if frame.height == 0 or "malformed" not in frame.columns:
            return []
        notes = []
        for r in frame.filter(pl.col("malformed")).group_by("side").len().sort("side").to_dicts():
            count = round(r["len"] / self._sample_fraction[r["side"]])
            about = "about " if self._sample_fraction[r["side"]] < 1 else ""
            notes.append(
                f"{about}{count} {r['side']} engine spans carried malformed latencies (negative or NaN); "
                "those values were ignored (e2e falls back to the span duration)"
            )
        return notes

    # --------------------------------------------------------------- sample
    @cached_property
    def dimensions(self) -> list[str]:
        """Low-cardinality attributes (2..64 values), named as received, present as columns of :attr:`requests`."""
        _ = self.requests
        return self._dimensions

    @cached_property
    def requests(self) -> pl.DataFrame:
        """Engine requests of both sides, sampled to at most ~``sample_per_side`` each.

        Columns: ``side``, ``slice``, ``start_ns``, ``trace_id``, ``span_id``,
        ``parent_span_id``, token counts, the cleaned latencies of
        :data:`LATENCIES` plus ``inference_s``, ``finish_reason``,
        ``attempt``, ``error_type``, ``status_code``, ``service_name``,
        ``service_version``, ``service_instance``, ``host_name``, and one string column per dimension (see
        :attr:`dimensions`). The sample keeps the same leading share of every
        time slice, so it is independent of latency and spread over the window.
        """
        import polars as pl

        keys = self._discover_dimensions()
        dim_sql = "".join(f", {self._dimension_expr(d)} AS {ident(d)}" for d in keys)
        base_cols = (
            "side, slice, start_ns, trace_id, span_id, parent_span_id, service_name, service_version, "
            "service_instance, host_name, "
            "input_tokens, output_tokens, cached_tokens, queue_s, ttft_s, prefill_s, decode_s, inference_s, "
            "e2e_s, tpot_s, finish_reason, attempt, error_type, status_code, malformed"
        )
        table = self.con.sql(f"SELECT * FROM {self.engine_sql(base_cols + dim_sql, sampled=True)}").to_arrow_table()
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        if self.has_other_spans and frame.height:
            # Gateways put tenant, route and model on the root span, not on the engine span:
            # lift the root span's low-cardinality attributes onto each request.
            roots = self._trace_frame(frame)
            root_dims = [c for c in roots.columns if c.startswith("root:")]
            trace_cols = ["trace_s", "gateway_s", "dependency_s", "attempts"]
            frame = frame.join(
                roots.select("trace_id", *trace_cols, *root_dims).unique("trace_id"), on="trace_id", how="left"
            )
            for col in root_dims:
                key = col.removeprefix("root:")
                if key in frame.columns:
                    frame = frame.with_columns(pl.coalesce(key, col).alias(key)).drop(col)
                else:
                    frame = frame.rename({col: key})
                    keys.append(key)
        # Cardinality was judged on a small head sample; re-check it on the whole sample.
        self._dimensions = sorted(d for d in keys if 2 <= frame[d].drop_nulls().n_unique() <= MAX_DIMENSION_VALUES)
        # In time order: an engine returns rows in any order (DuckDB's parallel scan, ClickHouse's
        # parts), and sums over ties in time must not depend on it.
        return frame.drop([d for d in keys if d not in self._dimensions]).sort("start_ns", "span_id")

    def _dimension_expr(self, key: str) -> str:
        # Only the maps the key was seen in: one lookup per row instead of two.
        return key_sql(key, self._dimension_maps.get(key, ("attributes", "resource_attributes")))

    def _discover_dimensions(self, head_rows: int = 5000) -> list[str]:
        """Attribute keys with 2..64 distinct values in the first ``head_rows`` requests of each side."""
        heads = " UNION ALL ".join(
            f"(SELECT * FROM {self.scan} WHERE {self._scope_sql()} AND {self._windows[s].predicate()} "
            f"LIMIT {head_rows})"
            for s in SIDES
        )
        keys, self._dimension_maps = discover_dimensions(self.con, heads, f"sre_head_{self._tag}")
        return keys

    def lazy(self, side: Side | None = None) -> pl.LazyFrame:
        """:attr:`requests` as a LazyFrame, optionally one side only."""
        import polars as pl

        frame = self.requests.lazy()
        return frame if side is None else frame.filter(pl.col("side") == side)

    # --------------------------------------------------------------- metrics
    @cached_property
    def metrics(self) -> MetricView:
        """The metric stream, per side."""
        b, c = self._windows["baseline"], self._windows["candidate"]
        return MetricView(self.con, b, c, self.selection, filter_sql=self._metric_filter)

    @cached_property
    def _metric_filter(self) -> str:
        """The ``--where`` filters on metric_points; ``FALSE`` (metrics unused, with a note) when they cannot apply.

        A filter on a key the metric stream does not carry (``tenant.id`` on
        engine metrics) cannot narrow it, and metrics of every tenant would
        pass for metrics of one: such a comparison reads no metrics at all.
        """
        if not self.selection.where:
            return "TRUE"
        lo, hi = self.bounds
        in_windows = f"time_ns >= {lo} AND time_ns < {hi} AND {service_sql(self.selection)}"
        present = fetch_one(self.con.execute(f"SELECT EXISTS (SELECT 1 FROM metric_points WHERE {in_windows})"))
        if present is None or not present[0]:
            return "FALSE"
        missing = []
        for key, _ in self.selection.where:
            carried = f"{in_windows} AND {metric_key_sql(key)} IS NOT NULL"
            row = fetch_one(self.con.execute(f"SELECT EXISTS (SELECT 1 FROM metric_points WHERE {carried})"))
            if row is None or not row[0]:
                missing.append(key)
        if missing:
            self.notes.append(
                f"metrics not used: the metric stream carries no {', '.join(missing)}, so it cannot be narrowed to "
                f"{describe_where(self.selection)}; findings rest on the filtered spans only"
            )
            return "FALSE"
        return " AND ".join(f"{metric_key_sql(key)} = {literal(value)}" for key, value in self.selection.where)


def _isnull(values: Any) -> Any:
    """Null mask of a column returned by ``fetchnumpy`` (masked array or object array)."""
    mask = np.ma.getmaskarray(values)
    if values.dtype == object:
        mask = mask | np.array([v is None for v in values], dtype=bool)
    return mask


def _ints(values: Any) -> Any:
    return np.ma.filled(values, 0).astype(np.int64)
