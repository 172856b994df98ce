"""SQL over ``metric_points`` that :class:`~sre_agent.analysis.metric_view.MetricView` runs.

Counters and histograms are cumulative (or delta) series, so every figure is built from
the increments between a series' consecutive points, with resets handled; these builders
write that once. The queries are DuckDB's dialect, which the ClickHouse engine respells.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np

if TYPE_CHECKING:
    import duckdb

__all__ = ["REPLICA", "REPLICA_KEY", "increment", "increments_sql", "interval_rows"]

#: The replica a metric point names: ``host.name``, else ``service.instance.id``.
REPLICA: Final[str] = "coalesce(host_name, service_instance)"
#: (attribute, value) of that replica, as two SQL columns.
REPLICA_KEY: Final[str] = f"CASE WHEN host_name IS NOT NULL THEN 'host.name' ELSE 'service.instance.id' END, {REPLICA}"
#: A series' instance for joining one metric's points with another's at the same scrape.
_INSTANCE: Final[str] = "coalesce(service_instance, host_name, series_key)"


def increment(value: str, previous: str) -> str:
    """SQL: the increment of ``value`` since ``previous`` (see :func:`increments_sql`).

    The reset test is on the counted column ``c``/``prev_c`` of that subquery.
    """
    return (
        f"CASE WHEN temporality = 'delta' THEN {value} WHEN prev_c IS NULL THEN 0 "
        f"WHEN c >= prev_c THEN {value} - {previous} ELSE {value} END"
    )


def increments_sql(where: str, *, histogram: bool = False) -> str:
    """A subquery of increments between consecutive points of each series matching ``where`` (column ``inc``).

    A cumulative series' first point in the window adds nothing (its increase before the
    window is not the window's); a value below the previous one is a reset, and the series
    restarted from 0; delta points are increments already. A counter's increments are of
    its value; with ``histogram`` they are of the observation count (``inc``) and the
    sum (``inc_sum``, reset where the count resets). Also carries ``host_name`` and
    ``service_instance`` for per-replica sums.
    """
    if histogram:
        counted, valid = "list_sum(bucket_counts)", "bucket_counts IS NOT NULL"
        summed = ', coalesce("sum", 0) AS s, lag(coalesce("sum", 0)) OVER w AS prev_s'
        inc_sum = f", {increment('s', 'prev_s')} AS inc_sum"
    else:
        counted, valid, summed, inc_sum = "value", "isfinite(value)", "", ""
    return f"""(
        SELECT host_name, service_instance, {increment("c", "prev_c")} AS inc{inc_sum}
        FROM (SELECT host_name, service_instance, temporality,
                {counted} AS c, lag({counted}) OVER w AS prev_c{summed}
              FROM metric_points WHERE {where} AND {valid}
              WINDOW w AS (PARTITION BY series_key ORDER BY time_ns)))"""


def interval_rows(con: duckdb.DuckDBPyConnection, itl: str, running: str, prompt: str | None) -> np.ndarray:
    """Rows (running, prompt tokens/s, ITL seconds, intervals) per replica and scrape interval.

    ``itl``, ``running`` and ``prompt`` are the WHERE clauses of the inter-token latency
    histogram's, the running gauge's and the prompt-token counter's points (``None``: no
    counter, prompt tokens/s 0). See :meth:`MetricView.itl_by_running`.
    """
    prompt_cte, prompt_join, prompt_rate = "", "", "0"
    if prompt is not None:
        prompt_cte = f""",
            p AS (
              SELECT i, time_ns, {increment("c", "prev_c")} AS tokens, time_ns - prev_t AS dt FROM (
                SELECT {_INSTANCE} AS i, time_ns, temporality, value AS c, lag(value) OVER w AS prev_c,
                       lag(time_ns) OVER w AS prev_t
                FROM metric_points WHERE {prompt} AND isfinite(value)
                WINDOW w AS (PARTITION BY series_key ORDER BY time_ns)))"""
        prompt_join = "LEFT JOIN p ON steps.i = p.i AND steps.time_ns = p.time_ns"
        prompt_rate = "coalesce(CASE WHEN p.dt > 0 THEN p.tokens * 1e9 / p.dt END, 0)"
    rows = con.execute(
        f"""WITH h AS (
              SELECT {_INSTANCE} AS i, time_ns, temporality,
                     list_sum(bucket_counts) AS c, lag(list_sum(bucket_counts)) OVER w AS prev_c,
                     coalesce("sum", 0) AS s, lag(coalesce("sum", 0)) OVER w AS prev_s
              FROM metric_points WHERE {itl} AND bucket_counts IS NOT NULL
              WINDOW w AS (PARTITION BY series_key ORDER BY time_ns)),
            steps AS (
              SELECT i, time_ns, {increment("c", "prev_c")} AS inc, {increment("s", "prev_s")} AS inc_sum FROM h),
            r AS (
              SELECT {_INSTANCE} AS i, time_ns, value,
                     lag(value) OVER (PARTITION BY series_key ORDER BY time_ns) AS prev
              FROM metric_points WHERE {running} AND isfinite(value)){prompt_cte}
            SELECT (r.value + coalesce(r.prev, r.value)) / 2, {prompt_rate}, steps.inc_sum, steps.inc
            FROM steps JOIN r ON steps.i = r.i AND steps.time_ns = r.time_ns
            {prompt_join}
            WHERE steps.inc > 0 AND isfinite(steps.inc_sum)
            ORDER BY r.i, r.time_ns"""
    ).fetchall()
    return np.array(rows, dtype=float).reshape(-1, 4)
