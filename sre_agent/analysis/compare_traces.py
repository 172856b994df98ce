"""Spans outside the engine: traces, gateway and dependency time, failed logical requests.

A mixin of :class:`sre_agent.analysis.compare.Comparison` (split out to keep each file
readable); everything here reads the same windows and sample.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from sre_agent.analysis import stats
from sre_agent.analysis.attribute_keys import MAX_DIMENSION_VALUES, NOT_DIMENSION_PREFIXES
from sre_agent.analysis.metric_view import fetch_one
from sre_agent.analysis.other_spans import OtherSpans
from sre_agent.analysis.resolve import log_bucket_sql, slice_position_sql, valid_latency_sql
from sre_agent.analysis.rules_api import SIDES
from sre_agent.store.attribute_sql import entries_sql, lookup_sql
from sre_agent.store.sql_text import ident

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from sre_agent.analysis.compare import SideWindow
    from sre_agent.analysis.selection import Selection

__all__ = ["TraceAggregates"]

_NS = 1_000_000_000


class TraceAggregates:
    """Trace-level views of a comparison.

    Needs ``con``, ``scan``, ``_windows``, ``_tag``, ``requests`` and ``engine_sql``.
    """

    con: duckdb.DuckDBPyConnection
    scan: str  # the relation large scans read (resolve.scan_relation)
    _windows: dict[str, SideWindow]
    _tag: str
    _trace_cache: pl.DataFrame | None
    selection: Selection
    slices: int

    @property
    def request_counts(self) -> dict[str, int]:  # provided by Comparison
        raise NotImplementedError

    @property
    def requests(self) -> pl.DataFrame:  # provided by Comparison
        raise NotImplementedError

    def engine_sql(self, columns: str = "*", *, sampled: bool = False) -> str:  # provided by Comparison
        raise NotImplementedError

    # --------------------------------------------------------- other spans
    @cached_property
    def other_spans(self) -> OtherSpans:
        """The non-engine spans of both windows as frames for the rules (:mod:`sre_agent.analysis.other_spans`)."""
        return OtherSpans(self.con, self._windows["baseline"], self._windows["candidate"], self.slices)

    @property
    def windows_overlap(self) -> bool:
        """Whether the two windows overlap in time (a version pair), so spans cannot be sided by start time."""
        b, c = self._windows["baseline"], self._windows["candidate"]
        return b.start_ns < c.end_ns and c.start_ns < b.end_ns

    @cached_property
    def has_other_spans(self) -> bool:
        """Whether the windows hold any non-engine spans (gateway, dependencies)."""
        b, c = self._windows["baseline"], self._windows["candidate"]
        lo, hi = min(b.start_ns, c.start_ns), max(b.end_ns, c.end_ns)
        row = fetch_one(
            self.con.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM spans WHERE NOT coalesce(is_engine, false) "
                f"AND start_ns >= {lo} AND start_ns < {hi} LIMIT 1)"
            )
        )
        return bool(row and row[0])

    def _trace_frame(self, requests: pl.DataFrame) -> pl.DataFrame:
        """Per trace of the sampled requests: root/dependency/engine time and the root span's dimensions."""
        import polars as pl

        if self._trace_cache is not None:
            return self._trace_cache
        reg, temp, roots = f"sre_req_{self._tag}", f"sre_traces_{self._tag}", f"sre_roots_{self._tag}"
        b, c = self._windows["baseline"], self._windows["candidate"]
        # Other services' spans may start a little earlier or later (queues, clock skew): widen the
        # time bound by an hour so zone maps still prune the scan.
        lo, hi = min(b.start_ns, c.start_ns) - 3600 * _NS, max(b.end_ns, c.end_ns) + 3600 * _NS
        self.con.register(reg, requests.select("trace_id").unique().to_arrow())
        try:
            self.con.execute(
                f"""
                CREATE OR REPLACE TEMP TABLE {temp} AS
                WITH t AS (
                  SELECT trace_id, span_id, parent_span_id, coalesce(is_engine, false) AS engine,
                    {valid_latency_sql("duration_s")} AS dur
                  FROM {self.scan} s WHERE start_ns >= {lo} AND start_ns < {hi}
                    AND trace_id IN (SELECT trace_id FROM {reg})
                ),
                engine_parents AS (SELECT DISTINCT trace_id, parent_span_id AS span_id FROM t WHERE engine)
                SELECT t.trace_id,
                  max(CASE WHEN t.parent_span_id IS NULL AND NOT t.engine THEN t.dur END) AS trace_s,
                  coalesce(sum(CASE WHEN NOT t.engine AND t.parent_span_id IS NOT NULL AND ep.span_id IS NULL
                               THEN t.dur END), 0) AS dependency_s,
                  count(*) FILTER (WHERE t.engine) AS attempts,
                  coalesce(sum(CASE WHEN t.engine THEN t.dur END), 0) AS engine_s,
                  any_value(t.span_id) FILTER (WHERE t.parent_span_id IS NULL AND NOT t.engine) AS root_span_id
                FROM t LEFT JOIN engine_parents ep ON t.trace_id = ep.trace_id AND t.span_id = ep.span_id
                GROUP BY t.trace_id
                """
            )
            # The root spans' own rows, for their attributes (read from the stored parts, see attribute_sql).
            self.con.execute(
                f"""
                CREATE OR REPLACE TEMP TABLE {roots} AS
                SELECT s.* FROM {self.scan} s
                JOIN {temp} r ON s.trace_id = r.trace_id AND s.span_id = r.root_span_id
                WHERE s.start_ns >= {lo} AND s.start_ns < {hi}
                """
            )
            rows = self.con.sql(
                f"""
                SELECT key, count(DISTINCT value) FROM (
                  {entries_sql(roots, "attributes")} UNION ALL {entries_sql(roots, "resource_attributes")})
                GROUP BY key
                """
            ).fetchall()
            keys = sorted(
                str(k)
                for k, n in rows
                if 2 <= int(n) <= MAX_DIMENSION_VALUES and not str(k).startswith(NOT_DIMENSION_PREFIXES)
            )
            dims = "".join(
                f", coalesce({lookup_sql(k, 'attributes')}, {lookup_sql(k, 'resource_attributes')}) "
                f"AS {ident('root:' + k)}"
                for k in keys
            )
            table = self.con.sql(
                f"SELECT t.trace_id, t.trace_s, t.dependency_s, t.attempts, t.engine_s, "
                f"CASE WHEN t.trace_s IS NOT NULL THEN greatest(0, t.trace_s - t.engine_s - t.dependency_s) END "
                f"AS gateway_s{dims} FROM {temp} t "
                f"LEFT JOIN {roots} r ON r.trace_id = t.trace_id AND r.span_id = t.root_span_id"
            ).to_arrow_table()
        finally:
            self.con.unregister(reg)
            self.con.execute(f"DROP TABLE IF EXISTS {temp}")
            self.con.execute(f"DROP TABLE IF EXISTS {roots}")
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        self._trace_cache = frame
        return frame

    @cached_property
    def root_histograms(self) -> dict[str, stats.SliceHistogram]:
        """Per side, the per-slice log-bucket histogram of root-span durations (what the gateway's client waited).

        Every root span that is not an engine span, assigned by its start to a window. For
        telemetry without engine request spans (a gateway's spans plus engine metrics), this is
        the one latency with per-request values, so the headline gets a CI over time blocks.
        Empty histograms when the windows hold no such spans, are version windows (a gateway
        span does not carry the engine's version), or a ``--where``/``--service`` filter is set
        (root spans cannot be filtered by the engine's attributes).
        """
        empty: dict[str, stats.SliceHistogram] = {s: stats.SliceHistogram.from_long([], [], []) for s in SIDES}
        b, c = self._windows["baseline"], self._windows["candidate"]
        if not self.has_other_spans or b.version is not None or c.version is not None:
            return empty
        if self.selection.where or self.selection.service:
            return empty
        k = self.slices
        rows = self.con.sql(
            f"""
            SELECT {slice_position_sql(b, c, k)} AS g, {log_bucket_sql("duration_s")} AS bucket, count(*) AS n
            FROM {self.scan}
            WHERE parent_span_id IS NULL AND NOT coalesce(is_engine, false) AND duration_s >= 0
              AND isfinite(duration_s) AND start_ns >= {min(b.start_ns, c.start_ns)}
              AND start_ns < {max(b.end_ns, c.end_ns)}
            GROUP BY ALL HAVING g IS NOT NULL
            """
        ).fetchnumpy()
        g, buckets, n = (np.asarray(rows[col], dtype=np.int64) for col in ("g", "bucket", "n"))
        out: dict[str, stats.SliceHistogram] = {}
        for i, side in enumerate(SIDES):
            mask = g // k == i
            out[side] = stats.SliceHistogram.from_long(g[mask] - i * k, buckets[mask], n[mask])
        return out

    @cached_property
    def root_dependency_histograms(self) -> dict[str, stats.SliceHistogram]:
        """Per side, the per-slice histogram of each root trace's dependency time (seconds).

        The dependency time of the traces behind :attr:`root_histograms`, for telemetry without
        engine request spans (:meth:`OtherSpans.dependency_time_per_trace`), so a slower
        retrieval or guardrail is a stage headline there too. Empty under the same conditions
        as :attr:`root_histograms`.
        """
        empty: dict[str, stats.SliceHistogram] = {s: stats.SliceHistogram.from_long([], [], []) for s in SIDES}
        if not any(self.root_histograms[s].n for s in SIDES):
            return empty
        frame = self.other_spans.dependency_time_per_trace()
        out: dict[str, stats.SliceHistogram] = {}
        for side in SIDES:
            part = frame.filter((frame["side"] == side) & frame["dependency_s"].is_not_null())
            out[side] = stats.SliceHistogram.from_values(part["slice"].to_numpy(), part["dependency_s"].to_numpy())
        return out

    @cached_property
    def traces(self) -> pl.DataFrame:
        """Per sampled engine request: its trace's root, gateway and dependency time.

        Columns: ``trace_id``, ``span_id``, ``side``, ``trace_s`` (root span
        duration; None when the engine span is the root), ``gateway_s`` (root
        minus engine calls minus dependencies, >= 0), ``dependency_s`` (summed
        durations of non-engine spans that do not wrap an engine call),
        ``attempts`` (engine spans in the trace). Durations come from each
        span's own clock, so clock skew between services does not bias them.
        Empty when the windows hold no non-engine spans.
        """
        import polars as pl

        schema = {"trace_id": pl.String, "span_id": pl.String, "side": pl.String, "trace_s": pl.Float64,
                  "gateway_s": pl.Float64, "dependency_s": pl.Float64, "attempts": pl.Int64}  # fmt: skip
        requests = self.requests
        if "trace_s" not in requests.columns:
            return pl.DataFrame(schema=schema)
        return requests.select(*schema).filter(pl.col("attempts").is_not_null()).cast(schema)  # type: ignore[arg-type]

    @cached_property
    def spans(self) -> pl.DataFrame:
        """Non-engine span groups per side: ``side, service_name, name, kind, count, p50_s, p99_s, mean_s, errors``.

        A span belongs to a side by its own start time and, in version mode,
        by the version of the engine requests in the same trace being
        unknowable here, so version mode uses time bounds only.
        """
        import polars as pl

        if not self.has_other_spans:
            return pl.DataFrame(
                schema={"side": pl.String, "service_name": pl.String, "name": pl.String, "kind": pl.String,
                        "count": pl.Int64, "p50_s": pl.Float64, "p99_s": pl.Float64, "mean_s": pl.Float64,
                        "errors": pl.Int64}
            )  # fmt: skip
        b, c = self._windows["baseline"], self._windows["candidate"]
        side = (
            f"CASE WHEN start_ns >= {b.start_ns} AND start_ns < {b.end_ns} THEN 'baseline' "
            f"WHEN start_ns >= {c.start_ns} AND start_ns < {c.end_ns} THEN 'candidate' END"
        )
        table = self.con.execute(
            f"""
            SELECT side, service_name, name, kind, count(*) AS count,
              quantile_cont(duration_s, 0.5) AS p50_s, quantile_cont(duration_s, 0.99) AS p99_s,
              avg(duration_s) AS mean_s, count(*) FILTER (WHERE status_code = 'error') AS errors
            FROM (SELECT {side} AS side, * FROM {self.scan} WHERE NOT coalesce(is_engine, false)
                  AND duration_s >= 0 AND isfinite(duration_s))
            WHERE side IS NOT NULL GROUP BY ALL ORDER BY service_name, name, side
            """
        ).to_arrow_table()
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        return frame

    @cached_property
    def failures(self) -> dict[str, tuple[int, int]]:
        """side -> (failed, total) logical requests.

        Root spans (the gateway's view) when the windows hold non-engine spans, so requests
        rejected before reaching an engine count; else the sampled engine requests with status
        ERROR or a finish reason of ``abort``/``error``.
        """
        b, c = self._windows["baseline"], self._windows["candidate"]
        if self.has_other_spans:
            side = (
                f"CASE WHEN start_ns >= {b.start_ns} AND start_ns < {b.end_ns} THEN 'baseline' "
                f"WHEN start_ns >= {c.start_ns} AND start_ns < {c.end_ns} THEN 'candidate' END"
            )
            sql = (
                f"SELECT side, count(*) FILTER (WHERE status_code = 'error'), count(*) FROM "
                f"(SELECT {side} AS side, status_code FROM spans WHERE parent_span_id IS NULL "
                f"AND NOT coalesce(is_engine, false) AND start_ns >= {min(b.start_ns, c.start_ns)} "
                f"AND start_ns < {max(b.end_ns, c.end_ns)}) WHERE side IS NOT NULL GROUP BY side"
            )
        else:
            # Rates from the sampled engine requests (the full scan stays a bare histogram).
            import polars as pl

            failed = (pl.col("status_code") == "error") | pl.col("finish_reason").is_in(["abort", "error"])
            per_side = self.requests.group_by("side").agg(failed.fill_null(False).sum().alias("f"), pl.len().alias("n"))
            sampled: dict[str, tuple[int, int]] = dict.fromkeys(SIDES, (0, 0))
            sampled.update({str(r["side"]): (int(r["f"]), int(r["n"])) for r in per_side.to_dicts()})
            return sampled
        rows = self.con.sql(sql).fetchall()
        out: dict[str, tuple[int, int]] = dict.fromkeys(SIDES, (0, 0))
        out.update({str(r[0]): (int(r[1]), int(r[2])) for r in rows})
        return out
