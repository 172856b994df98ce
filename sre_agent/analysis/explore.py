"""What the incident console shows besides the diagnosis, as pure queries.

Every function takes a DuckDB connection (or cursor) over the canonical
tables of :mod:`sre_agent.store.schema` and returns plain dataclasses; the same
figures travel over the HTTP API in ``--url`` mode (``sre_agent.api.explore_routes``
holds their JSON and query-string forms). Nothing here imports textual.

Aggregation happens in SQL: one scan per question, exact quantiles
(``quantile_cont``), time buckets for the timeline, ``LIMIT`` for samples;
only aggregates and a handful of rows reach Python, so each call stays well
under a second on a 10-million-span store.

Times are Unix epoch nanoseconds; latencies are seconds; rates are per second.
The slice table is in :mod:`sre_agent.analysis.explore_slices`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sre_agent.analysis.attribute_keys import filter_sql
from sre_agent.analysis.compare import resolve_windows
from sre_agent.analysis.resolve import SideWindow
from sre_agent.analysis.rules_api import SIDES
from sre_agent.analysis.selection import Selection, format_time
from sre_agent.errors import SelectionError, StoreError

__all__ = [
    "DEFAULT_SLOS",
    "LATENCY_METRICS",
    "DeployMarker",
    "Exemplar",
    "Overview",
    "Scope",
    "StageBreakdown",
    "Tile",
    "Timeline",
    "VersionInfo",
    "WaterfallSpan",
    "exemplars",
    "overview",
    "resolve_scope",
    "stage_breakdown",
    "timeline",
    "versions",
    "waterfall",
]

_NS = 1_000_000_000

# Tile order and labels: metric key -> (span column, label shown on the tile).
LATENCY_METRICS: dict[str, tuple[str, str]] = {
    "ttft": ("ttft_s", "TTFT"),
    "tpot": ("tpot_s", "TPOT/ITL"),
    "e2e": ("e2e_s", "e2e"),
    "queue": ("queue_s", "queue"),
}

# p99 targets in seconds used to colour tiles and to count goodput (a request
# counts as good when it did not fail and met the TTFT and TPOT targets, the
# DistServe definition). Overridable per call; the CLI takes --slo NAME=S.
DEFAULT_SLOS: dict[str, float] = {"ttft": 2.0, "tpot": 0.1, "e2e": 30.0, "queue": 1.0}


class Cursor(Protocol):
    """The slice of the DuckDB connection API these queries use."""

    def execute(self, query: str, parameters: object = ...) -> Any: ...

    def fetchall(self) -> list[tuple[Any, ...]]: ...


# --------------------------------------------------------------------------- scope


@dataclass(frozen=True)
class Scope:
    """A resolved comparison: two populations plus the filters applied to both.

    Attributes:
        label: one line for humans, e.g. ``deploy v2 at 12:00:00Z (after v1)``.
        deploy_ns: the deploy the comparison is about; ``None`` for version or window comparisons.
        where: ``(key, value)`` equality filters (canonical column or attribute key).
    """

    baseline: SideWindow
    candidate: SideWindow
    label: str
    deploy_ns: int | None = None
    service: str | None = None
    where: tuple[tuple[str, str], ...] = ()

    def narrowed(self, key: str, value: str) -> Scope:
        """The same comparison restricted to one more slice (replacing an earlier filter on ``key``)."""
        where = (*tuple((k, v) for k, v in self.where if k != key), (key, value))
        return dataclasses.replace(self, where=where)

    def widened(self) -> Scope:
        """The same comparison without slice filters."""
        return dataclasses.replace(self, where=())


def resolve_scope(cur: Cursor, selection: Selection) -> Scope:
    """Turn what the user asked for into two concrete populations.

    ``deploy_at`` and ``since_last_deploy`` compare the window before the
    deploy with the window after it; without ``--window`` both sides get the
    same length, the longest the data allows. Raises
    :class:`~sre_agent.errors.SelectionError` when the store cannot answer.
    """
    try:
        return _resolve_scope(cur, selection)
    except SelectionError:
        raise
    except Exception as exc:  # duckdb.Error and friends: a store problem, not a bug here
        raise StoreError(f"cannot read the store: {exc}") from exc


def _resolve_scope(cur: Cursor, selection: Selection) -> Scope:
    # The diagnosis's own resolution, so the console and `diagnose` compare the same windows.
    baseline, candidate, _, deploy = resolve_windows(cur, selection)  # type: ignore[arg-type]
    b, c = baseline, candidate
    common: dict[str, Any] = {"service": selection.service, "where": selection.where}
    if selection.mode == "windows":
        label = f"windows {_hhmm(b.start_ns)}-{_hhmm(b.end_ns)} vs {_hhmm(c.start_ns)}-{_hhmm(c.end_ns)}"
        return Scope(baseline, candidate, label, **common)
    if deploy is None:  # versions
        return Scope(
            baseline, candidate, f"versions {selection.baseline_version} vs {selection.candidate_version}", **common
        )
    what = f"deploy {deploy.version}" if deploy.version else "deploy"
    label = f"{what} at {format_time(deploy.time_ns)}" + (f" (after {deploy.previous})" if deploy.previous else "")
    return Scope(baseline, candidate, label, deploy_ns=deploy.time_ns, **common)


def _hhmm(ns: int) -> str:
    return format_time(ns)[11:16]


@dataclass(frozen=True)
class VersionInfo:
    """One ``service.version`` seen on engine requests: how many, first and last start (ISO 8601)."""

    service: str | None
    version: str
    requests: int
    first: str
    last: str


def versions(cur: Cursor, service: str | None = None) -> list[VersionInfo]:
    """The versions present, oldest first, so a version comparison can be picked from a list."""
    params: dict[str, Any] = {}
    where = "is_engine AND service_version IS NOT NULL"
    if service is not None:
        params["service"] = service
        where += " AND service_name = $service"
    rows = cur.execute(
        f"SELECT service_name, service_version, count(*), min(start_ns), max(start_ns) FROM spans "
        f"WHERE {where} GROUP BY ALL ORDER BY 4, 1, 2",
        params,
    ).fetchall()
    return [VersionInfo(s, str(v), int(n), format_time(int(lo)), format_time(int(hi))) for s, v, n, lo, hi in rows]


# ----------------------------------------------------------------- SQL helpers


def _filters(scope: Scope, params: dict[str, Any]) -> list[str]:
    """Engine spans under the scope's ``--service`` and ``--where`` (the diagnosis's own spelling)."""
    return ["is_engine", filter_sql(scope, params)]


def _side_where(scope: Scope, side: SideWindow, params: dict[str, Any]) -> str:
    """The WHERE clause of one side: its window (zone maps prune the rest), version and filters."""
    return " AND ".join([*_filters(scope, params), side.predicate(params)])


def _per_side(scope: Scope, params: dict[str, Any], select: str, tail: str = "") -> str:
    """``select`` run once per side (``UNION ALL``), each row led by the side's name.

    Separate scans per side let DuckDB prune by time and keep quantiles ungrouped,
    which is several times faster than one scan grouped by a CASE on the side.
    """
    parts = []
    for side in (scope.baseline, scope.candidate):
        where = _side_where(scope, side, params)
        parts.append(f"SELECT '{side.side}' AS side, {select} FROM spans WHERE {where} {tail}")
    return " UNION ALL ".join(f"({p})" for p in parts)


def _scoped(scope: Scope, params: dict[str, Any]) -> tuple[str, str]:
    """``(side_expr, where_sql)``: a CASE naming each row's side, and the WHERE clause for both."""
    b = scope.baseline.predicate(params)
    c = scope.candidate.predicate(params)
    # Candidate wins where windows overlap (version comparisons over the same span of time).
    side_expr = f"CASE WHEN {c} THEN 'candidate' WHEN {b} THEN 'baseline' END"
    return side_expr, " AND ".join([*_filters(scope, params), f"(({b}) OR ({c}))"])


def _quantiles(cur: Cursor, scope: Scope, column: str, q: float) -> dict[str, float | None]:
    """The ``q`` quantile of ``column`` on each side."""
    params: dict[str, Any] = {"q": q}
    rows = cur.execute(_per_side(scope, params, f"quantile_cont({column}, $q)"), params).fetchall()
    return {name: _num(value) for name, value in rows}


def _metric_column(metric: str) -> str:
    try:
        return LATENCY_METRICS[metric][0]
    except KeyError:
        raise SelectionError(f"unknown metric {metric!r}; one of {', '.join(LATENCY_METRICS)}") from None


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


# -------------------------------------------------------------------- overview


@dataclass(frozen=True)
class Tile:
    """One latency SLO tile: p50 and p99 on each side, seconds (``None`` = no data).

    ``status`` is ``breach`` when the candidate p99 exceeds the SLO, ``regressed``
    when it rose more than 20 % over the baseline p99, ``ok`` otherwise, and
    ``nodata`` when the candidate side has no value.
    """

    metric: str
    label: str
    p50_baseline: float | None
    p50_candidate: float | None
    p99_baseline: float | None
    p99_candidate: float | None
    slo_s: float | None
    status: Literal["ok", "regressed", "breach", "nodata"]

    @property
    def p99_ratio(self) -> float | None:
        """Candidate p99 over baseline p99; ``None`` when either is missing or zero."""
        if not self.p99_baseline or self.p99_candidate is None:
            return None
        return self.p99_candidate / self.p99_baseline


@dataclass(frozen=True)
class Overview:
    """The first screen's figures. Rates are requests per second over each side's window."""

    scope: Scope
    tiles: list[Tile]
    requests_baseline: int
    requests_candidate: int
    rate_baseline: float
    rate_candidate: float
    error_rate_baseline: float | None
    error_rate_candidate: float | None
    goodput_baseline: float
    goodput_candidate: float


def _tile_status(p99_b: float | None, p99_c: float | None, slo: float | None) -> Any:
    if p99_c is None:
        return "nodata"
    if slo is not None and p99_c > slo:
        return "breach"
    if p99_b and p99_c > 1.2 * p99_b:
        return "regressed"
    return "ok"


def overview(cur: Cursor, scope: Scope, slos: Mapping[str, float] | None = None) -> Overview:
    """SLO tiles for TTFT, TPOT/ITL, e2e and queue, plus request rate, error rate and goodput; one scan."""
    targets = {**DEFAULT_SLOS, **(slos or {})}
    params: dict[str, Any] = {"slo_ttft": targets["ttft"], "slo_tpot": targets["tpot"]}
    quantiles = ", ".join(f"quantile_cont({col}, [0.5, 0.99])" for col, _ in LATENCY_METRICS.values())
    failed = "(status_code = 'error' OR error_type IS NOT NULL)"
    select = f"""count(*) AS n, count(*) FILTER (WHERE {failed}) AS errors,
        count(*) FILTER (WHERE NOT {failed} AND coalesce(ttft_s, 0) <= $slo_ttft
                         AND coalesce(tpot_s, 0) <= $slo_tpot) AS good, {quantiles}"""
    rows = {row[0]: row for row in cur.execute(_per_side(scope, params, select), params).fetchall()}
    empty = (None, 0, 0, 0) + (None,) * len(LATENCY_METRICS)
    b, c = rows.get("baseline", empty), rows.get("candidate", empty)
    tiles = []
    for i, (metric, (_col, label)) in enumerate(LATENCY_METRICS.items()):
        qb, qc = b[4 + i] or [None, None], c[4 + i] or [None, None]
        p99_b, p99_c = _num(qb[1]), _num(qc[1])
        slo = targets.get(metric)
        tiles.append(Tile(metric, label, _num(qb[0]), _num(qc[0]), p99_b, p99_c, slo, _tile_status(p99_b, p99_c, slo)))
    return Overview(
        scope=scope,
        tiles=tiles,
        requests_baseline=int(b[1]),
        requests_candidate=int(c[1]),
        rate_baseline=b[1] / scope.baseline.seconds,
        rate_candidate=c[1] / scope.candidate.seconds,
        error_rate_baseline=b[2] / b[1] if b[1] else None,
        error_rate_candidate=c[2] / c[1] if c[1] else None,
        goodput_baseline=b[3] / scope.baseline.seconds,
        goodput_candidate=c[3] / scope.candidate.seconds,
    )


# -------------------------------------------------------------------- timeline


@dataclass(frozen=True)
class DeployMarker:
    """A deploy inside the timeline's range, and the bucket it falls in."""

    time_ns: int
    version: str
    bucket: int


@dataclass(frozen=True)
class Timeline:
    """p99 of ``metric`` per time bucket from ``start_ns``; ``None`` marks an empty bucket.

    ``series`` maps a name to one value per bucket: ``all`` for time-based
    comparisons, one series per version for version comparisons.
    """

    metric: str
    start_ns: int
    bucket_ns: int
    series: dict[str, list[float | None]]
    counts: list[int]
    deploys: list[DeployMarker]


def timeline(cur: Cursor, scope: Scope, metric: str = "e2e", buckets: int = 60) -> Timeline:
    """p99 of one latency metric over time, with deploy markers; one bucketed scan."""
    col = _metric_column(metric)
    start = min(scope.baseline.start_ns, scope.candidate.start_ns)
    end = max(scope.baseline.end_ns, scope.candidate.end_ns)
    bucket_ns = max(1, -(-(end - start) // buckets))
    params: dict[str, Any] = {"t0": start, "width": bucket_ns}
    by_version = scope.baseline.version is not None
    _side, where = _scoped(scope, params)
    series_expr = "service_version" if by_version else "'all'"
    sql = f"""
        SELECT {series_expr} AS series, (start_ns - $t0) // $width AS bucket,
               quantile_cont({col}, 0.99), count(*)
        FROM spans WHERE {where} GROUP BY ALL ORDER BY bucket"""
    names = [scope.baseline.version, scope.candidate.version] if by_version else ["all"]
    series: dict[str, list[float | None]] = {str(n): [None] * buckets for n in names}
    counts = [0] * buckets
    for name, bucket, p99, n in cur.execute(sql, params).fetchall():
        if 0 <= bucket < buckets and str(name) in series:
            series[str(name)][bucket] = _num(p99)
            counts[bucket] += int(n)
    deploys = [
        DeployMarker(int(t), str(v), int((t - start) // bucket_ns))
        for t, v in cur.execute(
            "SELECT time_ns, version FROM deploys WHERE time_ns >= ? AND time_ns < ? ORDER BY time_ns", [start, end]
        ).fetchall()
    ]
    if scope.deploy_ns is not None and not any(d.time_ns == scope.deploy_ns for d in deploys):
        deploys.append(DeployMarker(scope.deploy_ns, "deploy", int((scope.deploy_ns - start) // bucket_ns)))
    return Timeline(metric, start, bucket_ns, series, counts, deploys)


# ------------------------------------------------------------- stage breakdown

STAGES: tuple[str, ...] = ("queue", "prefill", "decode", "gateway", "dependency")


@dataclass(frozen=True)
class StageBreakdown:
    """Mean seconds per stage over the tail requests of each side.

    The tail is each side's requests at or above that side's p99 of ``metric``.
    ``gateway`` is the root span's time not covered by engine or dependency
    spans; ``dependency`` is time in leaf spans outside the engine (retrieval,
    tools, guardrails). Either is 0.0 when traces carry no such spans. Engine
    stages average every tail request; gateway and dependency average a
    deterministic sample of at most ``traces_per_side`` tail traces per side,
    because gathering a trace's other spans means scanning trace ids.
    """

    metric: str
    tail_threshold_baseline: float | None
    tail_threshold_candidate: float | None
    tail_requests_baseline: int
    tail_requests_candidate: int
    baseline: dict[str, float]
    candidate: dict[str, float]


def stage_breakdown(
    cur: Cursor, scope: Scope, metric: str = "e2e", quantile: float = 0.99, traces_per_side: int = 500
) -> StageBreakdown:
    """Where the tail's time goes, per side: one scan for thresholds, one over the tail's traces."""
    col = _metric_column(metric)
    thresholds = _quantiles(cur, scope, col, quantile)
    params: dict[str, Any] = {}
    tails = []
    for side in (scope.baseline, scope.candidate):
        if thresholds.get(side.side) is None:
            continue
        params[f"t_{side.side}"] = thresholds[side.side]
        tails.append(
            f"""SELECT '{side.side}' AS side, trace_id, coalesce(queue_s, 0) AS queue_s,
                   coalesce(prefill_s, ttft_s - coalesce(queue_s, 0), 0) AS prefill_s,
                   coalesce(decode_s, 0) AS decode_s, coalesce(e2e_s, duration_s, 0) AS engine_s
            FROM spans WHERE {_side_where(scope, side, params)} AND {col} >= $t_{side.side}"""
        )
    rows: dict[str, tuple[Any, ...]] = {}
    params["traces_per_side"] = traces_per_side
    if tails:
        # Traces of the tail start near their engine span; an hour's margin bounds the scan of their spans.
        params["lo"] = min(scope.baseline.start_ns, scope.candidate.start_ns) - 3600 * _NS
        params["hi"] = max(scope.baseline.end_ns, scope.candidate.end_ns) + 3600 * _NS
        sql = f"""
            WITH tail AS MATERIALIZED ({" UNION ALL ".join(tails)}),
            sampled AS MATERIALIZED (
                SELECT trace_id FROM tail
                QUALIFY row_number() OVER (PARTITION BY side ORDER BY md5(trace_id), trace_id) <= $traces_per_side
            ),
            trace_spans AS MATERIALIZED (
                SELECT trace_id, span_id, parent_span_id, duration_s, coalesce(is_engine, false) AS is_engine
                FROM spans WHERE start_ns >= $lo AND start_ns < $hi AND trace_id IN (SELECT trace_id FROM sampled)
            ),
            per_trace AS (
                SELECT p.trace_id,
                       max(p.duration_s) FILTER (WHERE p.parent_span_id IS NULL AND NOT p.is_engine) AS root_s,
                       sum(p.duration_s) FILTER (
                           WHERE NOT p.is_engine AND p.parent_span_id IS NOT NULL AND c.span_id IS NULL
                       ) AS dependency_s
                FROM trace_spans p
                LEFT JOIN (SELECT DISTINCT trace_id, parent_span_id AS span_id FROM trace_spans) c
                       ON c.trace_id = p.trace_id AND c.span_id = p.span_id
                GROUP BY p.trace_id
            )
            SELECT side, count(*), avg(queue_s), avg(prefill_s), avg(decode_s),
                   avg(greatest(coalesce(root_s, engine_s) - engine_s - coalesce(dependency_s, 0), 0))
                       FILTER (WHERE per_trace.trace_id IS NOT NULL),
                   avg(coalesce(dependency_s, 0)) FILTER (WHERE per_trace.trace_id IS NOT NULL)
            FROM tail LEFT JOIN per_trace USING (trace_id) GROUP BY side"""
        rows = {r[0]: r for r in cur.execute(sql, params).fetchall()}
    out: dict[str, dict[str, float]] = {}
    for name in SIDES:
        r = rows.get(name)
        out[name] = {stage: float(r[2 + i] or 0.0) if r else 0.0 for i, stage in enumerate(STAGES)}
    return StageBreakdown(
        metric,
        thresholds.get("baseline"),
        thresholds.get("candidate"),
        int(rows["baseline"][1]) if "baseline" in rows else 0,
        int(rows["candidate"][1]) if "candidate" in rows else 0,
        out["baseline"],
        out["candidate"],
    )


# ------------------------------------------------------------------- exemplars


@dataclass(frozen=True)
class Exemplar:
    """One slow request: its trace, when it started, and its latencies in seconds."""

    side: Literal["baseline", "candidate"]
    trace_id: str
    start_ns: int
    e2e_s: float | None
    ttft_s: float | None
    queue_s: float | None
    host_name: str | None
    model: str | None
    version: str | None


def exemplars(cur: Cursor, scope: Scope, metric: str = "e2e", per_side: int = 5) -> list[Exemplar]:
    """The slowest requests of each side by ``metric`` (top-k in SQL, ``per_side`` rows each)."""
    col = _metric_column(metric)
    params: dict[str, Any] = {"k": per_side}
    select = f"trace_id, start_ns, e2e_s, ttft_s, queue_s, host_name, model, service_version, {col} AS _order"
    sql = _per_side(scope, params, select, tail=f"AND {col} IS NOT NULL ORDER BY {col} DESC LIMIT $k")
    # A UNION ALL keeps no order of its own (ClickHouse runs the two sides in parallel).
    sql = f"SELECT * FROM ({sql}) ORDER BY side, _order DESC, trace_id"
    return [
        Exemplar(r[0], r[1], int(r[2]), _num(r[3]), _num(r[4]), _num(r[5]), r[6], r[7], r[8])
        for r in cur.execute(sql, params).fetchall()
    ]


@dataclass(frozen=True)
class WaterfallSpan:
    """One span of a trace laid out for a waterfall: offsets from the trace start, seconds."""

    span_id: str
    parent_span_id: str | None
    depth: int
    name: str
    service: str | None
    kind: str | None
    offset_s: float
    duration_s: float
    status: str | None
    is_engine: bool


def waterfall(cur: Cursor, trace_id: str, around_ns: int | None = None) -> list[WaterfallSpan]:
    """The spans of one trace in tree order (parents before children, siblings by start).

    ``around_ns`` (the start of one of its spans) bounds the scan to 5 minutes
    either side, so zone maps skip most of a large store; spans of the trace
    further away are left out. ``None`` scans every span.
    """
    sql = (
        "SELECT span_id, parent_span_id, name, service_name, kind, start_ns, "
        "coalesce(end_ns, start_ns), status_code, coalesce(is_engine, false) FROM spans WHERE trace_id = ?"
    )
    params: list[Any] = [trace_id]
    if around_ns is not None:
        sql += " AND start_ns BETWEEN ? AND ?"
        params += [around_ns - 300 * _NS, around_ns + 300 * _NS]
    rows = cur.execute(sql, params).fetchall()
    if not rows:
        return []
    t0 = min(r[5] for r in rows)
    ids = {r[0] for r in rows}
    children: dict[str | None, list[tuple[Any, ...]]] = {}
    for r in rows:
        parent = r[1] if r[1] in ids else None  # orphans hang off the top
        children.setdefault(parent, []).append(r)
    out: list[WaterfallSpan] = []

    def walk(parent: str | None, depth: int) -> None:
        for r in sorted(children.get(parent, []), key=lambda x: (x[5], x[0])):
            out.append(
                WaterfallSpan(
                    r[0], r[1], depth, r[2] or "", r[3], r[4], (r[5] - t0) / _NS, (r[6] - r[5]) / _NS, r[7], bool(r[8])
                )
            )
            walk(r[0], depth + 1)

    walk(None, 0)
    return out
