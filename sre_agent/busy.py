"""Busy intervals of engine requests: how many requests a replica was running at a moment.

A request is busy on its replica (``service.instance.id``, else ``host.name``,
else ``service.name``) from its scheduling (arrival + queue) to its end
(arrival + e2e). :func:`fetch_busy_intervals` reads every selected engine span
of a comparison once; :meth:`BusyIntervals.running_at` then counts, for any
moments, the requests running on a replica. The engine rules compare per-token
costs at equal running batch with it.

At 10M spans the fetch is the costliest step of a diagnosis, and it is pure
DuckDB and numpy work that releases the GIL, so :class:`Prefetch` can run it on
a second connection while the diagnosis does its Python work.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Final

import numpy as np

if TYPE_CHECKING:
    import duckdb

    from sre_agent.compare import Comparison

__all__ = ["BusyIntervals", "Prefetch", "fetch_busy_intervals"]

_NS: Final[int] = 1_000_000_000
#: Busy intervals ending this long after the last window are cut there (a malformed e2e of years
#: would otherwise overflow nanoseconds or widen the packed keys); one day, in ns.
HORIZON_NS: Final[int] = 86_400 * _NS
#: The replica of a span, as SQL.
REPLICA_SQL: Final[str] = "coalesce(service_instance, host_name, service_name, '')"


class BusyIntervals:
    """Every selected request's busy interval, keyed so one sorted array serves all replicas.

    Times are packed as ``replica_code << shift | (t - origin)`` so that a
    single sorted array of starts and one of ends answer "how many requests of
    replica r are running at t" by two binary searches: the starts and ends of
    replicas with smaller codes are all counted and cancel out. When the time
    span is too wide to pack (more than ~146 years at 1 ns with a few replicas),
    the arrays are kept per replica instead (``per_replica``).
    """

    def __init__(self, codes: dict[str, int], origin: int, shift: int) -> None:
        self.codes = codes
        self.origin = origin
        self.shift = shift
        self.packed = shift + (len(codes) + 1).bit_length() <= 62
        self.starts = self.ends = np.zeros(0, dtype=np.int64)
        self.per_replica: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def running_at(self, replica: str, t: np.ndarray) -> np.ndarray:
        """Requests of ``replica`` busy at each time in ``t`` (epoch ns), as int64."""
        c = self.codes.get(replica)
        if c is None:
            return np.zeros(len(t), dtype=np.int64)
        if self.packed:
            key = (np.int64(c) << self.shift) + np.clip(t - self.origin, 0, (1 << self.shift) - 1)
            starts, ends = self.starts, self.ends
        else:
            key = np.asarray(t, dtype=np.int64)
            starts, ends = self.per_replica[replica]
        # Searching in time order touches the 10M-long arrays mostly in cache: ~3x faster.
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        found = np.empty(len(key), dtype=np.int64)
        found[order] = np.searchsorted(starts, ordered, side="right") - np.searchsorted(ends, ordered, side="right")
        return found


def _sorted(values: np.ndarray) -> np.ndarray:
    """``values`` sorted ascending, read-only.

    polars' radix sort is ~4x faster than ``np.sort`` on 10M int64 keys here
    (0.26 s against 1.04 s), and sorts without holding the GIL.
    """
    import polars as pl

    return pl.Series(values).sort(multithreaded=False).to_numpy()


def _sorted_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays sorted, ``b`` on a second thread (the sort releases the GIL)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        later = pool.submit(_sorted, b)
        return _sorted(a), later.result()


#: Rows packed per step (see :func:`fetch_busy_intervals`).
_PACK_ROWS: Final[int] = 1 << 20
_HORIZON_S: Final[int] = HORIZON_NS // _NS
#: Rows whose latencies need no cleaning: e2e and queue (when present) in [0, HORIZON). Most rows,
#: so the scan computes their offsets with plain arithmetic: below the horizon no end is cut, and
#: ``>= 0`` with ``<`` also rejects NaN.
_PLAIN_SQL: Final[str] = (
    f"e2e_s >= 0 AND e2e_s < {_HORIZON_S} AND (queue_s IS NULL OR (queue_s >= 0 AND queue_s < {_HORIZON_S}))"
)


def fetch_busy_intervals(comparison: Comparison, con: duckdb.DuckDBPyConnection) -> BusyIntervals:
    """The busy intervals of every selected engine span of ``comparison``, read through ``con``.

    DuckDB codes the replica and computes the offsets from the window start in
    parallel, so three integer columns travel; numpy packs the keys in place and
    polars sorts them. Two scans: plain rows (:data:`_PLAIN_SQL`) with bare
    arithmetic, and the rare rest with the full cleaning of
    :data:`~sre_agent.compare.QUEUE_SQL` and :data:`~sre_agent.compare.E2E_SQL`
    (the cleaning as SQL expressions on every row cost 3x the CPU of the scan).
    Times use DuckDB's rounding ``CAST`` of seconds x 1e9 (callers' moments
    must round alike).
    """
    from sre_agent.compare import E2E_SQL, QUEUE_SQL

    names = [str(r[0]) for r in con.sql(comparison.scan_sql(f"DISTINCT {REPLICA_SQL}")).fetchall()]
    origin, last = comparison.bounds
    horizon = last + HORIZON_NS
    out = BusyIntervals({name: i + 1 for i, name in enumerate(names)}, origin, (horizon - origin).bit_length())
    limit = horizon - origin
    # The names go in as a literal: a prepared statement was several times slower on 10M rows.
    listed = "[" + ", ".join("'" + n.replace("'", "''") + "'" for n in names) + "]"
    code = f"CAST(coalesce(list_position({listed}, {REPLICA_SQL}), 0) AS INTEGER) AS code"
    offset = f"start_ns - {origin}"
    plain = (
        f"{code}, {offset} + CAST(coalesce(queue_s, 0) * 1e9 AS BIGINT) AS s, "
        f"{offset} + CAST(e2e_s * 1e9 AS BIGINT) AS f"
    )
    cleaned = (
        f"{code}, least({offset} + CAST(coalesce({QUEUE_SQL}, 0) * 1e9 AS BIGINT), {limit}) AS s, "
        f"least({offset} + CAST(least({E2E_SQL}, {limit / 1e9}) * 1e9 AS BIGINT), {limit}) AS f"
    )
    # fetchnumpy, not Arrow: it fills writable numpy arrays directly (Arrow's chunks would be
    # copied once more to concatenate them, and every fresh page of 10M-long arrays costs a fault).
    parts = [
        con.sql(comparison.scan_sql(plain, _PLAIN_SQL)).fetchnumpy(),
        con.sql(
            comparison.scan_sql(cleaned, f"NOT coalesce({_PLAIN_SQL}, false) AND {E2E_SQL} IS NOT NULL")
        ).fetchnumpy(),
    ]
    codes, starts, ends = (
        np.concatenate([np.asarray(p[name]) for p in parts]) if len(parts[1]["s"]) else np.asarray(parts[0][name])
        for name in ("code", "s", "f")
    )
    if out.packed:
        # Packed a million rows at a time: one 10M-long int64 temporary cost more in page
        # faults than the arithmetic (0.17 s on this VM); a small one is reused from the heap.
        for lo in range(0, len(codes), _PACK_ROWS):
            keys = codes[lo : lo + _PACK_ROWS].astype(np.int64) << out.shift
            starts[lo : lo + _PACK_ROWS] += keys
            ends[lo : lo + _PACK_ROWS] += keys
        out.starts, out.ends = _sorted_pair(starts, ends)
    else:
        out.per_replica = {
            n: _sorted_pair(starts[codes == c] + origin, ends[codes == c] + origin) for n, c in out.codes.items()
        }
    return out


class Prefetch:
    """:func:`fetch_busy_intervals` started on its own connection, collected on first use.

    Only started when the comparison reads the ``spans`` table itself: a
    temporary view named ``spans`` (the server's tenant scoping) belongs to one
    connection, and a second connection would read around it.
    """

    def __init__(self, comparison: Comparison) -> None:
        self._comparison = comparison
        self._future: Future[BusyIntervals] | None = None
        self._cursor: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    def start(self) -> bool:
        """Start the background fetch when it is safe; returns whether it started."""
        con = self._comparison.con
        shadowed = con.execute("SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = 'spans'").fetchall()
        if shadowed[0][0]:
            return False
        cursor = con.cursor()
        cursor.execute("SET enable_progress_bar = false")
        future: Future[BusyIntervals] = Future()

        def run() -> None:
            try:
                future.set_result(fetch_busy_intervals(self._comparison, cursor))
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                cursor.close()

        with self._lock:
            self._cursor, self._future = cursor, future
        threading.Thread(target=run, name="sre-agent-busy-prefetch", daemon=True).start()
        return True

    def result(self) -> BusyIntervals:
        """The busy intervals: the background fetch's, else fetched now on the comparison's connection."""
        with self._lock:
            future = self._future
        if future is None:
            return fetch_busy_intervals(self._comparison, self._comparison.con)
        return future.result()

    def cancel(self) -> None:
        """Interrupt a fetch still running (the diagnosis ended without needing it)."""
        with self._lock:
            future, cursor = self._future, self._cursor
        if future is not None and cursor is not None and not future.done():
            try:
                cursor.interrupt()
            except Exception:
                return
