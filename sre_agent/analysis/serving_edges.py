"""Where serving stops and starts around a deploy, and the rollout between: the edges the windows are cut at.

Read by :func:`sre_agent.analysis.resolve.resolve_windows` for the before/after modes. A pause
in engine requests at a deploy is a restart's dead time, left out of both windows, unless the
gateway kept receiving requests through it; a rolling restart's transition (both versions
serving) is left out of the candidate window. Times are Unix epoch ns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, NamedTuple

from sre_agent.analysis.metric_view import fetch_one

if TYPE_CHECKING:
    import duckdb

__all__ = ["DEAD_TIME_NS", "ROLLOUT_MAX_SHARE", "Rollout", "extent_and_edges", "per_version_sql", "rollout_of"]

_NS = 1_000_000_000

#: A pause in requests at a deploy that is dead time (5 s), not an ordinary gap between arrivals:
#: a restart's start-up (vLLM on CPU: 35-65 s), a drain before the swap.
DEAD_TIME_NS: Final[int] = 5 * _NS


class Rollout(NamedTuple):
    """A rolling deploy seen in the spans: versions that served before it kept serving after it for a while.

    Attributes:
        old: the versions that served before the deploy and after it, until the rollout ended.
        new: the versions first seen after the deploy.
        end_ns: just after the last start of an old version's request (Unix epoch ns).
        requests: the old versions' requests after the deploy (``None`` when read from metrics).
        seconds: how long after the deploy the old versions served.
    """

    old: tuple[str, ...]
    new: tuple[str, ...]
    end_ns: int
    requests: int | None
    seconds: float

    def note(self) -> str:
        """What the windows did about the rollout, for the report's notes."""
        served = "reported metrics" if self.requests is None else f"served {self.requests} requests"
        return (
            f"rolling deploy: {', '.join(self.old)} {served} for {self.seconds:.0f} s after the deploy beside "
            f"{', '.join(self.new)}; the candidate window starts when the rollout finished, so it holds the new "
            "version only"
        )


#: A rollout is a transition only while it is short against the data after the deploy: the old
#: versions served at most this share of it (beyond, both versions serve: a canary split or a
#: stalled rollout, compared before/after as the user asked, or as a version pair).
ROLLOUT_MAX_SHARE: Final[float] = 0.5


def extent_and_edges(
    con: duckdb.DuckDBPyConnection, where: str, deploy_ns: int, scan: str
) -> tuple[tuple[int | None, int | None, int], tuple[int, int], Rollout | None, str]:
    """The selected spans' first start, last start and count, the serving edges around ``deploy_ns``, the rollout,
    and a note when engine requests paused at the deploy while the gateway's did not ("" otherwise).

    One scan for all three, grouped by ``service.version`` (a handful of groups): on ClickHouse each
    pass over the exporter's attribute maps costs seconds at fleet scale. A second, over root spans,
    only where engine requests paused at the deploy (:func:`_users_kept_sending`). The edges are the end of
    serving before ``deploy_ns`` and its start after (ns), from the last and first request starts.

    A deploy marker is when the new version appeared, not when it served: a vLLM restart
    exports its start-up spans (weights, KV allocation) up to a minute before the first
    request. Counting that dead time as candidate window would leave the first minute of a
    one-minute window empty and dilute every per-second rate, so the default windows are
    measured over serving time on each side: the baseline ends just after the last request
    that started before the deploy, the candidate starts with the first one at or after it.
    No request started between the two, so nothing is dropped. A pause shorter than
    :data:`DEAD_TIME_NS` is an ordinary gap between arrivals: that side's edge is the deploy.

    A rolling restart (Kubernetes' default update) serves both versions until the last replica
    restarted: the fleet runs a replica short, and each restarted replica starts with an empty
    prefix cache, while the old version still serves part of the traffic. That transition is
    neither version; a candidate window that includes it blames the new version for the
    restart's capacity dip and cold caches and dilutes its own change with the old version's
    requests (an engine gauge's peak is the old ``max_num_seqs``; the old replicas form a "slice"
    that did not regress). So when a version first seen after the deploy exists and the versions
    seen before it stopped within :data:`ROLLOUT_MAX_SHARE` of the data after it, the
    :class:`Rollout` says where the new version alone serves; the candidate window then starts
    there and ends where it would have, and the baseline keeps its length.
    """
    rows = con.execute(per_version_sql("start_ns", scan, where, deploy_ns)).fetchall()
    lo = min((int(r[1]) for r in rows if r[1] is not None), default=None)
    hi = max((int(r[2]) for r in rows if r[2] is not None), default=None)
    extent = (lo, hi, sum(int(r[3]) for r in rows))
    before = max((int(r[4]) for r in rows if r[4] is not None), default=None)
    after = min((int(r[5]) for r in rows if r[5] is not None), default=None)
    edges, paused = _edges(before, after, deploy_ns), ""
    if edges != (deploy_ns, deploy_ns):
        edges, paused = _users_kept_sending(con, scan, deploy_ns, edges)
    return extent, edges, rollout_of(rows, deploy_ns, hi), paused


def _edges(before: int | None, after: int | None, deploy_ns: int) -> tuple[int, int]:
    """Serving edges from the last start before ``deploy_ns`` and the first at or after it (ns); a pause
    shorter than :data:`DEAD_TIME_NS`, or no start at all, puts that side's edge at the deploy."""
    last_before = deploy_ns if before is None or deploy_ns - (before + 1) < DEAD_TIME_NS else before + 1
    first_after = deploy_ns if after is None or after - deploy_ns < DEAD_TIME_NS else after
    return last_before, first_after


def _users_kept_sending(
    con: duckdb.DuckDBPyConnection, scan: str, deploy_ns: int, engine: tuple[int, int]
) -> tuple[tuple[int, int], str]:
    """The engine's serving edges kept only where the gateway's requests (roots outside the engine) paused too.

    A pause in engine requests is a restart's dead time only when users' requests paused with
    it. Requests the gateway kept receiving were sent and failed or timed out: the pause is the
    incident (1340103: a gateway retrying after 0.7 s aborted every engine request behind a 27 s
    queue; no engine span started for 177 s after the deploy while 800 attempts did, the windows
    shrank to 0 s and the retries went unseen). Returns the edges and a note ("" when unchanged).
    """
    query = (
        f"SELECT max(start_ns) FILTER (WHERE start_ns < {deploy_ns}), min(start_ns) FILTER (WHERE start_ns >= "
        f"{deploy_ns}) FROM {scan} WHERE parent_span_id IS NULL AND NOT coalesce(is_engine, false)"
    )
    row = fetch_one(con.execute(query)) or (None, None)
    gateway = _edges(row[0], row[1], deploy_ns)
    # No gateway roots on a side say nothing about it, and a gateway span starts a little before
    # its engine call: the engine's edge stands unless the gateway's pause is shorter by dead time.
    edges = (
        gateway[0] if row[0] is not None and gateway[0] - engine[0] >= DEAD_TIME_NS else engine[0],
        gateway[1] if row[1] is not None and engine[1] - gateway[1] >= DEAD_TIME_NS else engine[1],
    )
    said = " and ".join(
        f"{abs(old - deploy_ns) / _NS:.0f} s {what}"
        for what, old, new in zip(("before", "after"), engine, edges, strict=True)
        if new != old
    )
    if not said:
        return edges, ""
    return (
        edges,
        f"no engine request started for {said} the deploy while the gateway kept receiving requests: "
        "the pause is part of the windows",
    )


def per_version_sql(time: str, table: str, where: str, deploy_ns: int) -> str:
    """Per ``service.version``: first and last ``time``, rows, last ``time`` before ``deploy_ns``, first at or
    after it, rows at or after it (the rows :func:`rollout_of` reads)."""
    return (
        f"SELECT service_version, min({time}), max({time}), count(*), "
        f"max({time}) FILTER (WHERE {time} < {deploy_ns}), min({time}) FILTER (WHERE {time} >= {deploy_ns}), "
        f"count(*) FILTER (WHERE {time} >= {deploy_ns}) FROM {table} WHERE {where} GROUP BY 1"
    )


def rollout_of(rows: list[tuple[Any, ...]], deploy_ns: int, hi: int | None, *, counted: bool = True) -> Rollout | None:
    """The rollout in per-version rows, or ``None`` (see :func:`extent_and_edges`).

    ``rows`` as :func:`_per_version_sql` gives them. ``counted``: the rows are requests (else
    metric points, whose number says nothing to a reader).
    """
    versioned = [r for r in rows if r[0] is not None]
    old = [r for r in versioned if r[4] is not None and int(r[6]) > 0]
    new = [r for r in versioned if r[4] is None and int(r[6]) > 0]
    if not old or not new or hi is None or len(versioned) != len(rows):
        return None  # no version change, or rows without a version that cannot be told apart
    end = max(int(r[2]) for r in old) + 1
    if end - deploy_ns > ROLLOUT_MAX_SHARE * max(1, hi - deploy_ns):
        return None
    # Both versions served at once: a hot swap at a later time (a time picked before the deploy)
    # ends the old version before the new one starts, and the windows stay where they were put.
    if min(int(r[5]) for r in new) >= end:
        return None
    return Rollout(
        tuple(sorted(str(r[0]) for r in old)),
        tuple(sorted(str(r[0]) for r in new)),
        end,
        sum(int(r[6]) for r in old) if counted else None,
        (end - deploy_ns) / _NS,
    )
