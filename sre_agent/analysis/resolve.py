"""Resolve a Selection into the two windows a comparison reads.

The one resolution behind the diagnosis, the canary and the console
(:func:`resolve_windows`), so they compare the same populations: a deploy
time, a version pair, explicit windows, or the last deploy (a marker, else
the newest ``service.version``). A last deploy whose previous version kept
serving beside it (a canary split) becomes the version-pair comparison over
the time both served. A ``--service`` that matches nothing is an
:class:`~sre_agent.errors.EmptySelectionError`. Times are Unix epoch ns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol

from sre_agent.analysis.metric_view import fetch_one
from sre_agent.analysis.rules_api import SIDES, Side
from sre_agent.analysis.selection import Selection, format_time
from sre_agent.analysis.serving_edges import Rollout, extent_and_edges, per_version_sql, rollout_of
from sre_agent.analysis.stats import BUCKETS_PER_E, MIN_REQUESTS, ZERO_BUCKET
from sre_agent.errors import EmptySelectionError, SelectionError
from sre_agent.store.sql_text import dialect_of, literal

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "E2E_SQL",
    "QUEUE_SQL",
    "SCAN",
    "SIDES",
    "DeployPoint",
    "Side",
    "SideWindow",
    "Windows",
    "describe_where",
    "log_bucket_sql",
    "resolve_windows",
    "scan_relation",
    "service_sql",
    "slice_position_sql",
    "valid_latency_sql",
]


_NS = 1_000_000_000


def valid_latency_sql(expr: str) -> str:
    """NULL for malformed latencies (negative, NaN, infinite) so they never skew a quantile."""
    return f"CASE WHEN {expr} >= 0 AND isfinite({expr}) THEN {expr} END"


#: Queue seconds of a span; NULL when malformed.
QUEUE_SQL: Final[str] = valid_latency_sql("queue_s")
#: End-to-end seconds of a span: ``e2e_s``, else the span duration; NULL when malformed.
E2E_SQL: Final[str] = f"coalesce({valid_latency_sql('e2e_s')}, {valid_latency_sql('duration_s')})"


#: What the diagnosis's large scans read: the stored table, not the ``spans`` view. Read through
#: any projection (a view, a subquery), DuckDB 2.0 plans the sampled engine scan of 10M spans
#: 2.3x slower (0.25 s against 0.11 s, tests/benchmarks/diagnose.py). The columns are the
#: view's less the two whole maps, plus their stored parts.
SCAN: Final[str] = "span_rows"


def scan_relation(con: duckdb.DuckDBPyConnection) -> str:
    """:data:`SCAN`, unless this connection has no ``span_rows`` or scopes ``spans`` alone by a temp view.

    A tenant-scoped cursor (server._shadow_tables) shadows both; a caller that shadows only
    ``spans`` still gets what it asked for, at the view's speed. On ClickHouse
    (:mod:`sre_agent.store.clickhouse`) ``spans`` is the only relation.
    """
    if dialect_of(con) != "duckdb":
        return "spans"
    row = fetch_one(
        con.execute(
            "SELECT (SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = 'spans'), "
            "(SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = 'span_rows'), "
            "(SELECT count(*) FROM duckdb_tables() WHERE table_name = 'span_rows')"
        )
    )
    spans_shadowed, rows_shadowed, stored = (int(v) for v in row) if row else (0, 0, 0)
    if not (stored or rows_shadowed) or (spans_shadowed and not rows_shadowed):
        return "spans"
    return SCAN


class Filters(Protocol):
    """What narrows both sides alike: a :class:`~sre_agent.analysis.selection.Selection` or the console's scope."""

    @property
    def service(self) -> str | None: ...

    @property
    def where(self) -> tuple[tuple[str, str], ...]: ...


def service_sql(selection: Filters, params: dict[str, Any] | None = None) -> str:
    """The WHERE fragment for ``--service`` alone (``TRUE`` without it); ``$service`` with ``params``."""
    if selection.service is None:
        return "TRUE"
    if params is None:
        return f"service_name = {literal(selection.service)}"
    params["service"] = selection.service
    return "service_name = $service"


def describe_where(selection: Selection) -> str:
    """The ``--where`` filters as the user typed them."""
    return " ".join(f"--where {key}={value}" for key, value in selection.where)


def log_bucket_sql(value: str) -> str:
    """SQL for the log bucket of ``value`` (seconds) as :mod:`sre_agent.analysis.stats` bins it.

    NULL when negative or NULL.
    """
    return (
        f"CASE WHEN {value} > 0 THEN CAST(floor(ln({value}) * {BUCKETS_PER_E}) AS INTEGER) "
        f"WHEN {value} = 0 THEN {ZERO_BUCKET} END"
    )


def slice_position_sql(baseline: SideWindow, candidate: SideWindow, slices: int) -> str:
    """SQL for a row's global slice: ``0..slices-1`` in the baseline window, ``slices..2*slices-1`` in the candidate's.

    NULL outside both windows. Each window is cut into ``slices`` equal time slices by ``start_ns``.
    """
    b, c, k = baseline, candidate, slices
    return (
        f"CASE WHEN {b.predicate()} THEN (start_ns - {b.start_ns}) * {k} // {b.end_ns - b.start_ns} "
        f"WHEN {c.predicate()} THEN {k} + (start_ns - {c.start_ns}) * {k} // {c.end_ns - c.start_ns} END"
    )


def _check_service(con: duckdb.DuckDBPyConnection, selection: Selection, scan: str) -> None:
    """Raise :class:`EmptySelectionError` naming ``--service`` when no span or metric carries it."""
    if selection.service is None:
        return
    svc = service_sql(selection)
    exists = f"SELECT EXISTS (SELECT 1 FROM {scan} WHERE {svc}) OR EXISTS (SELECT 1 FROM metric_points WHERE {svc})"
    row = fetch_one(con.execute(exists))
    if row is not None and row[0]:
        return
    rows = con.execute(
        "SELECT service_name FROM spans WHERE service_name IS NOT NULL GROUP BY 1 UNION "
        "SELECT service_name FROM metric_points WHERE service_name IS NOT NULL GROUP BY 1 ORDER BY 1 LIMIT 20"
    ).fetchall()
    known = ", ".join(str(r[0]) for r in rows) or "none"
    raise EmptySelectionError(f"no spans for service {selection.service} (services: {known})")


@dataclass(frozen=True)
class SideWindow:
    """One side of the comparison.

    Attributes:
        side: ``baseline`` or ``candidate``.
        start_ns / end_ns: the half-open window, Unix epoch ns.
        version: the ``service.version`` the side is restricted to (``None`` = any).
        requests: engine requests selected (all rows, not the sample).
    """

    side: Side
    start_ns: int
    end_ns: int
    version: str | None = None
    requests: int = 0

    @property
    def seconds(self) -> float:
        """Window length in seconds."""
        return (self.end_ns - self.start_ns) / _NS

    def predicate(self, params: dict[str, Any] | None = None) -> str:
        """SQL boolean selecting this side's rows (on ``start_ns`` and ``service_version``).

        Values are literals, or with ``params`` named parameters added to it (``$b_start``,
        ``$b_end``, ``$b_version``; ``c_`` for the candidate), for the queries that bind them.
        """
        start, end, version = self.start_ns, self.end_ns, self.version
        if params is None:
            sql = f"start_ns >= {start} AND start_ns < {end}"
            return sql if version is None else f"{sql} AND service_version = {literal(version)}"
        prefix = self.side[0]
        params[f"{prefix}_start"], params[f"{prefix}_end"] = start, end
        sql = f"start_ns >= ${prefix}_start AND start_ns < ${prefix}_end"
        if version is not None:
            params[f"{prefix}_version"] = version
            sql += f" AND service_version = ${prefix}_version"
        return sql

    def describe(self, selection: Selection) -> dict[str, Any]:
        """The CONTRACTS section 3 ``baseline``/``candidate`` object."""
        flt: dict[str, Any] = {}
        if selection.service is not None:
            flt["service"] = selection.service
        if self.version is not None:
            flt["service.version"] = self.version
        flt.update(dict(selection.where))
        return {
            "start": format_time(self.start_ns),
            "end": format_time(self.end_ns),
            "requests": self.requests,
            "filter": flt,
        }


@dataclass(frozen=True)
class DeployPoint:
    """The deploy a before/after comparison is about.

    Attributes:
        time_ns: when it happened, Unix epoch ns.
        version / previous: the ``service.version`` deployed and the one before, when known.
    """

    time_ns: int
    version: str | None = None
    previous: str | None = None


class Windows(NamedTuple):
    """A resolved selection: the two windows (request counts not yet filled), how they were chosen, the deploy."""

    baseline: SideWindow
    candidate: SideWindow
    notes: list[str]
    deploy: DeployPoint | None


def resolve_windows(con: duckdb.DuckDBPyConnection, selection: Selection) -> Windows:
    """Turn a Selection into two windows; raises SelectionError with a useful message.

    The one resolution behind the diagnosis, the canary and the console, so
    they compare the same populations. ``deploy`` is set for the
    ``deploy_at`` and ``since_last_deploy`` modes.
    """
    # Windows and deploys are properties of the service, not of a slice: --where narrows the
    # populations inside the windows (Comparison's scans), it does not move them. Otherwise
    # narrowing to a slice that started late would shift both windows, and the console's
    # drill-down would no longer compare the same time ranges as the overview.
    scan = scan_relation(con)  # once: each call is a catalog query
    _check_service(con, selection, scan)
    where = f"is_engine AND {service_sql(selection)}"
    notes: list[str] = []

    extents: dict[str, tuple[int | None, int | None, int]] = {}

    def extent(extra: str = "TRUE") -> tuple[int | None, int | None, int]:
        if extra not in extents:
            row = fetch_one(
                con.execute(f"SELECT min(start_ns), max(start_ns), count(*) FROM {scan} WHERE {where} AND {extra}")
            )
            assert row is not None
            extents[extra] = (row[0], row[1], int(row[2]))
        return extents[extra]

    if selection.mode == "windows":
        b, c = selection.baseline, selection.candidate
        assert b is not None
        assert c is not None
        return Windows(
            SideWindow("baseline", b.start_ns, b.end_ns), SideWindow("candidate", c.start_ns, c.end_ns), notes, None
        )
    if selection.mode == "versions":
        out: list[SideWindow] = []
        for side, version in (("baseline", selection.baseline_version), ("candidate", selection.candidate_version)):
            assert version is not None
            explicit = getattr(selection, side)
            if explicit is not None:
                out.append(SideWindow(side, explicit.start_ns, explicit.end_ns, version))  # type: ignore[arg-type]
                continue
            lo, hi, n = extent(f"service_version = {literal(version)}")
            if lo is None or hi is None or n == 0:
                known = [r[0] for r in con.execute(
                    f"SELECT DISTINCT service_version FROM {scan} "
                    f"WHERE {where} AND service_version IS NOT NULL "
                    "ORDER BY 1 LIMIT 20").fetchall()]  # fmt: skip
                raise SelectionError(
                    f"no engine requests with service.version={version!r}; "
                    f"versions present: {', '.join(known) or 'none'}"
                )
            out.append(SideWindow(side, lo, hi + 1, version))  # type: ignore[arg-type]
        return Windows(out[0], out[1], notes, None)
    if selection.mode == "since_last_deploy":
        deploy, how = _last_deploy(con, selection, where, scan)
        notes.append(how)
        extents["TRUE"], edges, rollout, paused = extent_and_edges(con, where, deploy.time_ns, scan)
        split, note = _canary_split(con, where, deploy, selection.window_ns, extent(), scan=scan)
        if note:
            notes.append(note)
        if split is not None:
            return Windows(split[0], split[1], notes, deploy)
    else:
        assert selection.deploy_at_ns is not None
        deploy = DeployPoint(selection.deploy_at_ns)
        extents["TRUE"], edges, rollout, paused = extent_and_edges(con, where, deploy.time_ns, scan)
    if paused:
        notes.append(paused)
    deploy_ns = deploy.time_ns
    lo, hi, n = extent()
    # Where each side's serving stops and starts (the deploy itself without request spans).
    last_before, first_after = edges
    if rollout is None and n == 0:
        rollout = _metric_rollout(con, selection, deploy_ns)
    gaps = [(what, gap) for what, gap in (("before", deploy_ns - last_before), ("after", first_after - deploy_ns))
            if gap > 0]  # fmt: skip
    if gaps:
        said = " and ".join(f"{gap / _NS:.0f} s {what}" for what, gap in gaps)
        notes.append(
            f"no engine request started for {said} the deploy (a restart or a drain): "
            "the windows are measured over serving time, from the last request before and the first after"
        )
    window_ns = selection.window_ns
    if window_ns is None:
        if lo is None or hi is None or n == 0:
            # No spans at all (metrics-only telemetry): size the windows by the metric stream instead.
            query = f"SELECT min(time_ns), max(time_ns), count(*) FROM metric_points WHERE {service_sql(selection)}"
            row = fetch_one(con.execute(query))
            lo, hi, n = (row[0], row[1], int(row[2])) if row else (None, None, 0)
            if lo is None or hi is None or n == 0:
                raise SelectionError("the store holds no engine request spans or metrics matching the filters")
            notes.append("no engine request spans: windows sized by the metric stream")
        window_ns = min(last_before - lo, hi + 1 - first_after)
        if window_ns <= 0:
            side = "before" if deploy_ns <= lo else "after"
            raise SelectionError(
                f"no engine requests {side} the deploy at {format_time(deploy_ns)} "
                f"(data spans {format_time(lo)}..{format_time(hi)}); pick another time or use --baseline/--candidate"
            )
        notes.append(f"windows of {window_ns / _NS:.0f} s each side of the deploy (equal lengths, capped by the data)")
    candidate_start = first_after
    if rollout is not None and rollout.end_ns < first_after + window_ns:
        # Only the rollout is left out: the candidate ends where it would have, and the baseline
        # keeps its length (cutting both would cost the comparison the baseline's power too).
        candidate_start = max(first_after, rollout.end_ns)
        notes.append(rollout.note())
    return Windows(
        SideWindow("baseline", last_before - window_ns, last_before),
        SideWindow("candidate", candidate_start, first_after + window_ns),
        notes,
        deploy,
    )


def _metric_rollout(con: duckdb.DuckDBPyConnection, selection: Selection, deploy_ns: int) -> Rollout | None:
    """A rollout read from the metric stream's ``service.version`` when there are no request spans.

    A restarted replica exports its series under the new version; the old version's last
    point after the deploy is where the rollout ended (a replica drained for good that kept
    exporting would stretch it past :data:`~sre_agent.analysis.serving_edges.ROLLOUT_MAX_SHARE`,
    and then nothing is cut).
    """
    rows = con.execute(per_version_sql("time_ns", "metric_points", service_sql(selection), deploy_ns)).fetchall()
    hi = max((int(r[2]) for r in rows if r[2] is not None), default=None)
    return rollout_of(rows, deploy_ns, hi, counted=False)


def _last_deploy(
    con: duckdb.DuckDBPyConnection, selection: Selection, where: str, scan: str
) -> tuple[DeployPoint, str]:
    """The latest deploy marker, else the latest ``service.version`` change; and a note saying which."""
    row = fetch_one(
        con.execute(
            "SELECT time_ns, service_name, version, previous_version FROM deploys "
            f"WHERE {service_sql(selection)} ORDER BY time_ns DESC LIMIT 1"
        )
    )
    if row is not None:
        at = int(row[0])
        return DeployPoint(at, row[2], row[3]), f"deploy marker: {row[1]} {row[2]} at {format_time(at)}"
    rows = con.execute(
        f"SELECT service_version, min(start_ns) AS first FROM {scan} "
        f"WHERE {where} AND service_version IS NOT NULL "
        "GROUP BY 1 ORDER BY first"
    ).fetchall()
    if len(rows) < 2:
        raise SelectionError(
            "no deploy marker and no service.version change in the store; "
            "use --deploy-at TIME, --baseline-version/--candidate-version or --baseline/--candidate"
        )
    version, first = rows[-1]
    note = f"service.version change to {version} first seen at {format_time(int(first))}"
    return DeployPoint(int(first), version, rows[-2][0]), note


#: The previous version still serves beside the new one (a canary split or a partial rollout, not a
#: hot swap or a finished rolling restart) when it served requests through at least this share of
#: the time since the new version appeared.
SPLIT_MIN_OVERLAP: Final[float] = 0.5
#: Before/after stays the comparison when the data before the deploy is at least this share of the
#: time both versions served: a slice localiser then finds the new version's replicas in the mix.
#: With less, the "before" window is a sliver (both versions started together) and the two versions
#: side by side over the time both served compare far more requests.
SPLIT_MIN_BEFORE: Final[float] = 0.5


def _canary_split(
    con: duckdb.DuckDBPyConnection,
    where: str,
    deploy: DeployPoint,
    window_ns: int | None,
    data: tuple[int | None, int | None, int],
    *,
    scan: str,
) -> tuple[tuple[SideWindow, SideWindow] | None, str]:
    """Whether the deploy's previous version kept serving beside it: version-pair windows and a note.

    ``data`` is the first and last start and the count of the selected
    engine spans. Returns ``(None, "")`` for a plain deploy; ``(None, note)``
    when both versions serve but the data before the deploy supports a
    before/after comparison (the note says how to compare them side by side);
    and the version-pair windows over the time both served, with a note, when
    the "before" window would be a sliver: with an automatic deploy marker at
    the second version's first span, before/after put a few requests against
    a mix of both versions.
    """
    new, old = deploy.version, deploy.previous
    lo, hi, _ = data
    if new is None or old is None or new == old or lo is None or hi is None:
        return None, ""
    # One version at a time and only after the deploy: on a store sorted by time, row groups of
    # other versions or earlier times are skipped by their min/max, so a hot swap costs nothing.
    after = f"{where} AND start_ns >= {deploy.time_ns} AND service_version = "
    row = fetch_one(con.execute(f"SELECT count(*), max(start_ns) FROM {scan} WHERE {after}{literal(old)}"))
    old_after, old_last = (int(row[0]), row[1]) if row else (0, None)
    if old_after < MIN_REQUESTS or old_last is None:
        return None, ""
    both_end = min(int(old_last), hi) + 1
    overlap = both_end - deploy.time_ns
    if overlap < SPLIT_MIN_OVERLAP * max(1, hi - deploy.time_ns):
        return None, ""
    serving = f"{old} and {new} serve at the same time ({old} served {old_after} requests after {new} appeared)"
    if deploy.time_ns - lo >= SPLIT_MIN_BEFORE * overlap:
        return None, (
            f"{serving}: the candidate window mixes both versions; "
            f"--baseline-version {old} --candidate-version {new} compares them side by side"
        )
    row = fetch_one(con.execute(f"SELECT count(*) FROM {scan} WHERE {after}{literal(new)}"))
    if row is None or int(row[0]) < MIN_REQUESTS:
        return None, ""
    end = both_end if window_ns is None else min(both_end, deploy.time_ns + window_ns)
    note = (
        f"{serving} and the data before {new} appeared is too short for before/after: comparing the two "
        f"versions side by side over {format_time(deploy.time_ns)}..{format_time(end)} "
        "(--baseline-version/--candidate-version choose another pair)"
    )
    return (SideWindow("baseline", deploy.time_ns, end, old), SideWindow("candidate", deploy.time_ns, end, new)), note
