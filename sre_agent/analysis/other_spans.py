"""Spans outside the engine, handed to the rules as frames: roots, attempts, dependency groups.

The rules that read gateway and dependency spans (``dependency``, ``errors``,
``retry_amplification``) get these frames from :attr:`Comparison.other_spans
<sre_agent.analysis.compare.Comparison.other_spans>`; the SQL that sides, slices and
groups the spans lives here, so no rule touches the connection (issue 16).

Every frame is built from one relation, the non-engine spans of both windows by
each span's own start time, with columns ``side``, ``slice`` (the comparison's
time slices), ``trace_id``, ``span_id``, ``service_name``, ``name``, ``kind``,
``duration_s`` (seconds; ``NULL`` when negative or not finite), ``status_code``,
``error_type``, ``attempt``, ``is_root`` (no parent), ``target`` (the called
host: ``server.address``, else ``net.peer.name``) and ``wraps_engine`` (an
engine request span is its child, or it is a client span naming a model,
``gen_ai.request.model``: a gateway's inference call even when the engine sends
no spans). The ``--service`` filter is not applied: dependencies live in other
services.
"""

from __future__ import annotations

import uuid
from functools import cached_property
from typing import TYPE_CHECKING, Final

from sre_agent.analysis.attribute_keys import discover_dimensions, key_sql
from sre_agent.analysis.resolve import valid_latency_sql
from sre_agent.store.attribute_sql import lookup_sql
from sre_agent.store.sql_text import ident

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from sre_agent.analysis.resolve import SideWindow

__all__ = ["OtherSpans"]

_NS: Final[int] = 1_000_000_000
#: How far outside the windows an engine span may start and still mark its parent as an engine
#: call (seconds): a long request's engine span starts before the gateway attempt that ends in it.
_ENGINE_MARGIN_S: Final[int] = 3600


class OtherSpans:
    """The non-engine spans of a comparison's two windows, read on demand as polars frames.

    ``slices`` is the number of time slices per window (the comparison's cluster unit).
    """

    def __init__(
        self, con: duckdb.DuckDBPyConnection, baseline: SideWindow, candidate: SideWindow, slices: int
    ) -> None:
        self._con = con
        self._b, self._c = baseline, candidate
        self._slices = slices

    @cached_property
    def _side_sql(self) -> str:
        """The side of span ``s`` by its start time (NULL outside both windows)."""
        b, c = self._b, self._c
        in_b = f"s.start_ns >= {b.start_ns} AND s.start_ns < {b.end_ns}"
        in_c = f"s.start_ns >= {c.start_ns} AND s.start_ns < {c.end_ns}"
        # A span in both windows (overlapping windows) is the baseline's; callers refuse overlaps.
        return f"CASE WHEN {in_b} THEN 'baseline' WHEN {in_c} THEN 'candidate' END"

    @cached_property
    def _sql(self) -> str:
        """The sided subquery every frame reads (see the module docstring for its columns)."""
        b, c, k = self._b, self._c, self._slices
        lo, hi = min(b.start_ns, c.start_ns), max(b.end_ns, c.end_ns)
        in_b = f"s.start_ns >= {b.start_ns} AND s.start_ns < {b.end_ns}"
        side_sql = self._side_sql
        b_len, c_len = max(1, b.end_ns - b.start_ns), max(1, c.end_ns - c.start_ns)
        slice_sql = (
            f"CAST(floor((s.start_ns - CASE WHEN {in_b} THEN {b.start_ns} ELSE {c.start_ns} END) * {k}.0 "
            f"/ CASE WHEN {in_b} THEN {b_len} ELSE {c_len} END) AS INTEGER)"
        )
        margin = _ENGINE_MARGIN_S * _NS
        return f"""(
            WITH eng AS (
              SELECT DISTINCT trace_id, parent_span_id FROM spans
              WHERE is_engine AND parent_span_id IS NOT NULL
                AND start_ns >= {lo - margin} AND start_ns < {hi + margin}
            )
            SELECT {side_sql} AS side, {slice_sql} AS slice, s.trace_id, s.span_id, s.service_name, s.name, s.kind,
              {valid_latency_sql("s.duration_s")} AS duration_s,
              s.status_code, s.error_type, s.attempt, s.parent_span_id IS NULL AS is_root,
              coalesce({lookup_sql("server.address", "attributes")}, {lookup_sql("net.peer.name", "attributes")})
                AS target,
              eng.trace_id IS NOT NULL OR (s.kind = 'client' AND s.model IS NOT NULL) AS wraps_engine
            FROM spans s LEFT JOIN eng ON eng.trace_id = s.trace_id AND eng.parent_span_id = s.span_id
            WHERE NOT coalesce(s.is_engine, false) AND s.start_ns >= {lo} AND s.start_ns < {hi}
              AND {side_sql} IS NOT NULL
        )"""

    @cached_property
    def _marked(self) -> str:
        """:attr:`_sql` plus ``calls_engine``: the span's group (service, name, kind) has a span that wraps an engine.

        Gateway attempt spans are engine calls, not dependencies, including their failed
        attempts that never reached an engine.
        """
        return f"""(
            SELECT *, bool_or(wraps_engine) OVER (PARTITION BY service_name, name, kind) AS calls_engine
            FROM {self._sql}
        )"""

    def _frame(self, sql: str, params: list[object] | None = None) -> pl.DataFrame:
        frame: pl.DataFrame = self._con.sql(sql, params=params).pl()
        return frame

    def roots(self) -> pl.DataFrame:
        """Root spans (logical requests): trace id, side, slice, duration, status code and error type."""
        return self._frame(
            f"SELECT trace_id, side, slice, duration_s, status_code, error_type FROM {self._sql} WHERE is_root"
        )

    @cached_property
    def root_dimensions(self) -> pl.DataFrame:
        """Per root span: ``trace_id``, ``side`` and one column per dimension the roots carry.

        A dimension is an attribute (span side first, then resource) with 2..64 values among
        the root spans of both windows, as the engine requests' dimensions are found
        (:func:`~sre_agent.analysis.attribute_keys.discover_dimensions`). Where the engine sends no
        spans, a gateway's root spans are the only place a request's tenant or route is told.
        """
        b, c = self._b, self._c
        lo, hi = min(b.start_ns, c.start_ns), max(b.end_ns, c.end_ns)
        where = (
            f"s.parent_span_id IS NULL AND NOT coalesce(s.is_engine, false) AND s.start_ns >= {lo} "
            f"AND s.start_ns < {hi} AND {self._side_sql} IS NOT NULL"
        )
        dims, maps = discover_dimensions(
            self._con, f"SELECT s.* FROM spans s WHERE {where}", f"sre_roots_{uuid.uuid4().hex[:10]}"
        )
        both = ("attributes", "resource_attributes")
        columns = "".join(f", {key_sql(k, maps.get(k, both))} AS {ident(k)}" for k in dims)
        return self._frame(f"SELECT s.trace_id, {self._side_sql} AS side{columns} FROM spans s WHERE {where}")

    def root_counts(self) -> dict[str, int]:
        """Root spans per side (absent sides are missing from the dict)."""
        rows = self._con.sql(f"SELECT side, count(*) FROM {self._sql} WHERE is_root GROUP BY side").fetchall()
        return {str(side): int(n) for side, n in rows}

    def dependency_groups(self) -> pl.DataFrame:
        """Non-root spans with a duration per ``side``, ``slice``, ``service_name``, ``name``, ``kind``.

        Columns ``n`` (spans) and ``total_s`` (seconds). Groups that call an engine are
        left out (see :attr:`_marked`).
        """
        return self._frame(
            f"""SELECT side, slice, service_name, name, kind, count(*) AS n, sum(duration_s) AS total_s
                FROM {self._marked} WHERE NOT is_root AND duration_s IS NOT NULL AND NOT calls_engine
                GROUP BY side, slice, service_name, name, kind"""
        )

    def dependency_time_per_trace(self) -> pl.DataFrame:
        """Per trace with a root span: ``side``, ``slice`` (the root's) and ``dependency_s``.

        ``dependency_s`` sums the durations of the trace's non-root spans outside every group
        that calls an engine (see :attr:`_marked`): what the request waited on
        retrieval, guardrails and the like, 0 when it called none.
        """
        return self._frame(
            f"""SELECT any_value(side) FILTER (WHERE is_root) AS side, any_value(slice) FILTER (WHERE is_root) AS slice,
                  coalesce(sum(duration_s) FILTER (WHERE NOT is_root AND NOT calls_engine), 0.0) AS dependency_s
                FROM {self._marked} GROUP BY trace_id HAVING bool_or(is_root)"""
        )

    def group_p99(self) -> pl.DataFrame:
        """99th percentile of non-root span durations: ``side``, ``service_name``, ``name``, ``kind``, ``p99_s``."""
        return self._frame(
            f"""SELECT side, service_name, name, kind, quantile_cont(duration_s, 0.99) AS p99_s FROM {self._sql}
                WHERE NOT is_root GROUP BY ALL"""
        )

    def group_spans(self, service: str | None, name: str | None, kind: str | None) -> pl.DataFrame:
        """One group's non-root spans with a duration: ``side``, ``trace_id``, ``duration_s``."""
        return self._frame(
            f"""SELECT side, trace_id, duration_s FROM {self._sql} WHERE service_name IS NOT DISTINCT FROM ?
                AND name IS NOT DISTINCT FROM ? AND kind IS NOT DISTINCT FROM ? AND duration_s IS NOT NULL
                AND NOT is_root""",
            [service, name, kind],
        )

    def engine_calls(self) -> pl.DataFrame:
        """The calls of groups that call an engine (gateway attempts): ``side``, ``slice``, ``target``, ``failed``.

        ``target`` is the host called (``server.address``, else ``net.peer.name``; NULL when
        neither is set); ``failed`` whether the span's status is an error. A failed attempt
        that never reached an engine counts, which is the point: an engine that rejects
        requests before serving them leaves no span of its own.
        """
        return self._frame(
            f"""SELECT side, slice, target, coalesce(status_code = 'error', false) AS failed
                FROM {self._marked} WHERE calls_engine AND NOT is_root AND kind = 'client'"""
        )

    @cached_property
    def attempts_per_trace(self) -> pl.DataFrame:
        """Per trace with a root span: ``trace_id``, ``side``, ``slice``, ``trace_s``, ``wrapped``, ``attempts``,
        ``failed``.

        ``wrapped`` counts spans that wrap an engine call or carry a resend count;
        ``attempts`` is the larger of that and the highest resend count + 1; ``failed``
        is whether the root's status is an error. Read once per comparison (the retried-share
        headline and ``retry_amplification`` both use it).
        """
        return self._frame(
            f"""
            WITH t AS (
              SELECT trace_id,
                any_value(side) FILTER (WHERE is_root) AS side, any_value(slice) FILTER (WHERE is_root) AS slice,
                max(duration_s) FILTER (WHERE is_root) AS trace_s,
                count(*) FILTER (WHERE wraps_engine OR coalesce(attempt, 0) > 0) AS wrapped,
                max(coalesce(attempt, 0)) AS max_resend,
                coalesce(bool_or(status_code = 'error') FILTER (WHERE is_root), false) AS failed
              FROM {self._sql} GROUP BY trace_id
            )
            SELECT trace_id, side, slice, trace_s, wrapped, greatest(wrapped, max_resend + 1) AS attempts, failed
            FROM t WHERE side IS NOT NULL AND trace_s IS NOT NULL
            """
        )
