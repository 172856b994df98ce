"""Busy intervals of engine requests: how many requests a replica was running at a moment.

A request is busy on its replica (``service.instance.id``, else ``host.name``,
else ``service.name``) from its scheduling (arrival + queue) to its end
(arrival + e2e). The engine rules compare per-token costs at equal running
batch, counted at fixed moments of each sampled request's life
(:func:`moments`: prefill at its scheduling, decode at a quarter, half and
three quarters of its decode). :func:`fetch_busy_intervals` reads every
selected engine span of a comparison once and keeps the intervals that contain
at least one such moment; :meth:`BusyIntervals.running_at` then counts, at
those moments, the requests running on a replica.

At 10M spans the fetch is the costliest step of a diagnosis, and it is pure
DuckDB and numpy work that releases the GIL, so :class:`Prefetch` can run it on
a second connection while the diagnosis does its Python work.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Final, Literal

import numpy as np

from sre_agent.analysis.resolve import E2E_SQL, QUEUE_SQL
from sre_agent.store.sql_text import dialect_of, literal

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from sre_agent.analysis.compare import Comparison

__all__ = [
    "MOMENT_FRACTIONS",
    "BusyIntervals",
    "MomentBins",
    "Prefetch",
    "Stage",
    "fetch_busy_intervals",
    "moment_at",
    "moment_bins",
    "moments",
    "replica_expr",
]

Stage = Literal["prefill", "decode"]
#: Where in a request's life its running batch is counted, as fractions of the span from the
#: stage's start (prefill: its scheduling; decode: its first token) to the request's end.
MOMENT_FRACTIONS: Final[dict[str, tuple[float, ...]]] = {"prefill": (0.0,), "decode": (0.25, 0.5, 0.75)}

_NS: Final[int] = 1_000_000_000
#: Busy intervals ending this long after the last window are cut there (a malformed e2e of years
#: would otherwise overflow nanoseconds or widen the packed keys); one day, in ns.
HORIZON_NS: Final[int] = 86_400 * _NS
#: The replica of a span, as SQL.
REPLICA_SQL: Final[str] = "coalesce(service_instance, host_name, service_name, '')"
#: Bins of moments kept at most: bins are 2**30 ns (~1.07 s) wide, wider when the windows are far apart.
_MAX_BINS_LOG2: Final[int] = 22


def replica_expr() -> pl.Expr:
    """The replica of a request as a polars expression (``replica``), the same as :data:`REPLICA_SQL`."""
    import polars as pl

    return pl.coalesce("service_instance", "host_name", "service_name", pl.lit("")).alias("replica")


def moments(requests: pl.DataFrame, at: Stage) -> tuple[pl.DataFrame, tuple[float, ...]]:
    """The sampled requests with the moments their running batch is counted at.

    ``requests`` is :attr:`Comparison.requests`. Columns ``span_id``,
    ``replica``, ``start_ns``, ``_from`` and ``_span`` (ns): a request is
    looked at ``_from + int(_span * f)`` (:func:`moment_at`) for each returned
    fraction ``f`` (:data:`MOMENT_FRACTIONS`). Requests without an e2e latency are left out.
    """
    import polars as pl

    sample = requests.filter(pl.col("e2e_s").is_not_null()).select(
        "span_id",
        replica_expr(),
        "start_ns",
        pl.col("queue_s").fill_null(0.0),
        "ttft_s",
        "e2e_s",
    )
    # Rounded like DuckDB's CAST in the busy intervals: truncating put a request's scheduling
    # a nanosecond before its own busy interval, so it missed itself in the count.
    sched = pl.col("start_ns") + (pl.col("queue_s") * _NS).round().cast(pl.Int64)
    end = pl.col("start_ns") + (pl.col("e2e_s") * _NS).round().cast(pl.Int64)
    first = pl.col("start_ns") + (pl.col("ttft_s").fill_null(pl.col("queue_s")) * _NS).round().cast(pl.Int64)
    since = sched if at == "prefill" else first
    return sample.with_columns(since.alias("_from"), (end - since).alias("_span")), MOMENT_FRACTIONS[at]


def moment_at(sample: pl.DataFrame, fraction: float) -> np.ndarray:
    """The moments ``_from + int(_span * fraction)`` of a :func:`moments` frame, epoch ns."""
    since: np.ndarray = sample["_from"].to_numpy() + (sample["_span"].to_numpy() * fraction).astype(np.int64)
    return since


def _moment_times(requests: pl.DataFrame) -> np.ndarray:
    """Every moment :func:`moments` yields for either stage, epoch ns."""
    stages: tuple[Stage, ...] = ("prefill", "decode")
    times: list[np.ndarray] = []
    for at in stages:
        sample, fractions = moments(requests, at)
        times.extend(moment_at(sample, f) for f in fractions)
    return np.concatenate(times) if times else np.zeros(0, dtype=np.int64)


class MomentBins:
    """Which time bins hold at least one moment, as a prefix count: exact tests of "any moment in [a, b]"."""

    def __init__(self, offsets: np.ndarray, limit: int) -> None:
        """``offsets``: moments minus the origin (ns), clipped to ``[0, limit]``."""
        self.shift = max(30, limit.bit_length() - _MAX_BINS_LOG2)
        marked = np.zeros((limit >> self.shift) + 2, dtype=np.int32)
        marked[np.clip(offsets, 0, limit) >> self.shift] = 1
        self.prefix = np.concatenate([np.zeros(1, dtype=np.int32), np.cumsum(marked, dtype=np.int32)])

    def any_between(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Per pair: whether a marked bin lies in ``[bin(lo), bin(hi)]`` (offsets in ``[0, limit]``, lo <= hi)."""
        found: np.ndarray = self.prefix[(hi >> self.shift) + 1] > self.prefix[lo >> self.shift]
        return found

    def holds(self, offsets: np.ndarray) -> np.ndarray:
        """Per offset: whether its bin is marked."""
        return self.any_between(offsets, offsets)


class BusyIntervals:
    """Every selected request's busy interval, keyed so one sorted array serves all replicas.

    Times are packed as ``replica_code << shift | (t - origin)`` so that a
    single sorted array of starts and one of ends answer "how many requests of
    replica r are running at t" by two binary searches: the starts and ends of
    replicas with smaller codes are all counted and cancel out. When the time
    span is too wide to pack (more than ~146 years at 1 ns with a few replicas),
    the arrays are kept per replica instead (``per_replica``).

    Only intervals containing a moment of :func:`moments` are kept (in the
    10M-span benchmark, ~37 %), so counts are exact at those moments and
    :meth:`running_at` refuses others.
    """

    def __init__(self, codes: dict[str, int], origin: int, limit: int, bins: MomentBins) -> None:
        self.codes = codes
        self.origin = origin
        #: Largest offset from :attr:`origin` an interval can have (the horizon), ns.
        self.limit = limit
        self.shift = limit.bit_length()
        self.bins = bins
        self.packed = self.shift + (len(codes) + 1).bit_length() <= 62
        self.starts = self.ends = np.zeros(0, dtype=np.int64)
        self.per_replica: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def running_at(self, replica: str, t: np.ndarray) -> np.ndarray:
        """Requests of ``replica`` busy at each time in ``t`` (epoch ns, moments of :func:`moments`), as int64.

        Raises ValueError for a time in no bin of the moments: intervals around it were not kept.
        """
        # Every interval lies within [0, limit]: a later moment counts as the limit does.
        offsets = np.clip(np.asarray(t, dtype=np.int64) - self.origin, 0, self.limit)
        if not self.bins.holds(offsets).all():
            raise ValueError("running_at is exact only at the moments of busy.moments(); another time was asked")
        c = self.codes.get(replica)
        if c is None:
            return np.zeros(len(t), dtype=np.int64)
        if self.packed:
            key = (np.int64(c) << self.shift) + offsets
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


#: Rows read and packed per step (see :func:`fetch_busy_intervals`).
_BATCH_ROWS: Final[int] = 1 << 20
_HORIZON_S: Final[int] = HORIZON_NS // _NS
#: Rows whose latencies need no cleaning: e2e and queue (when present) in [0, HORIZON). Most rows,
#: so the scan computes their offsets with plain arithmetic: below the horizon no end is cut, and
#: ``>= 0`` with ``<`` also rejects NaN.
_PLAIN_SQL: Final[str] = (
    f"e2e_s >= 0 AND e2e_s < {_HORIZON_S} AND (queue_s IS NULL OR (queue_s >= 0 AND queue_s < {_HORIZON_S}))"
)


def _extent(comparison: Comparison) -> tuple[int, int]:
    """Origin (epoch ns) and limit (largest offset, ns) of the busy intervals of ``comparison``."""
    origin, last = comparison.bounds
    return origin, last + HORIZON_NS - origin


def moment_bins(comparison: Comparison) -> MomentBins:
    """The bins holding the moments of ``comparison``'s sample (reads :attr:`Comparison.requests`)."""
    origin, limit = _extent(comparison)
    return MomentBins(_moment_times(comparison.requests) - origin, limit)


def fetch_busy_intervals(
    comparison: Comparison, con: duckdb.DuckDBPyConnection, bins: MomentBins | None = None
) -> BusyIntervals:
    """The busy intervals around the sample's moments of ``comparison``, read through ``con``.

    ``bins`` defaults to :func:`moment_bins` of the comparison. Every selected
    engine span is read; those whose interval contains no moment's bin are
    dropped before the sort (exactly: they count at none of the moments).

    DuckDB codes the replica and computes the offsets from the window start in
    parallel, so three integer columns travel, streamed; numpy filters them and
    packs the keys in place, and polars sorts them. Two scans: plain rows (:data:`_PLAIN_SQL`) with bare
    arithmetic, and the rare rest with the full cleaning of
    :data:`~sre_agent.analysis.resolve.QUEUE_SQL` and :data:`~sre_agent.analysis.resolve.E2E_SQL`
    (the cleaning as SQL expressions on every row cost 3x the CPU of the scan).
    Times use DuckDB's rounding ``CAST`` of seconds x 1e9 (callers' moments
    must round alike).
    """

    if dialect_of(con) != "duckdb":
        return _fetch_sorted_in_engine(comparison, con, bins)
    # Sorted: DISTINCT alone yields the names in a different order from run to run, and the
    # codes (hence the packed keys) must not depend on the run.
    distinct = comparison.scan_sql(f"DISTINCT {REPLICA_SQL} AS replica")
    names = [str(r[0]) for r in con.sql(f"SELECT replica FROM ({distinct}) ORDER BY replica").fetchall()]
    origin, limit = _extent(comparison)
    bins = bins if bins is not None else moment_bins(comparison)
    out = BusyIntervals({name: i + 1 for i, name in enumerate(names)}, origin, limit, bins)
    # The names go in as a literal: a prepared statement was several times slower on 10M rows.
    listed = "[" + ", ".join(literal(n) for n in names) + "]"
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
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    queries = (
        comparison.scan_sql(plain, _PLAIN_SQL),
        comparison.scan_sql(cleaned, f"NOT coalesce({_PLAIN_SQL}, false) AND {E2E_SQL} IS NOT NULL"),
    )
    for sql in queries:
        # Streamed a million rows at a time and filtered as they arrive: half the wall time of
        # one 10M-row fetch, and a fifth of its page faults (fresh 10M-long arrays fault on every page).
        for batch in con.sql(sql).to_arrow_reader(_BATCH_ROWS):
            code, s, f = (batch.column(i).to_numpy(zero_copy_only=False) for i in range(3))
            # Only intervals that contain a moment count anywhere; a malformed one (end before
            # its scheduling) counts -1 between the two, so it is tested over that range too.
            keep = bins.any_between(np.minimum(s, f), np.maximum(s, f))
            kept.append((code[keep], s[keep], f[keep]))
    codes, starts, ends = (
        np.concatenate([part[i] for part in kept]) if kept else np.zeros(0, dtype=np.int64) for i in range(3)
    )
    if out.packed:
        # Packed a million rows at a time: one 10M-long int64 temporary cost more in page
        # faults than the arithmetic (0.17 s on this VM); a small one is reused from the heap.
        for lo in range(0, len(codes), _BATCH_ROWS):
            keys = codes[lo : lo + _BATCH_ROWS].astype(np.int64) << out.shift
            starts[lo : lo + _BATCH_ROWS] += keys
            ends[lo : lo + _BATCH_ROWS] += keys
        out.starts, out.ends = _sorted_pair(starts, ends)
    else:
        out.per_replica = {
            n: _sorted_pair(starts[codes == c] + origin, ends[codes == c] + origin) for n, c in out.codes.items()
        }
    return out


def _fetch_sorted_in_engine(
    comparison: Comparison, con: duckdb.DuckDBPyConnection, bins: MomentBins | None
) -> BusyIntervals:
    """:func:`fetch_busy_intervals` where the engine sorts: one scan, one row per replica back.

    On ClickHouse the starts and ends are grouped per replica and sorted there, and
    come back as two arrays per replica: one pass over the spans and no numpy
    sort, against three passes (names, plain and cleaned rows) and a client-side
    sort of 10M keys. Every interval is kept (no moment-bin filter; it saved
    transfer and sorting on the client, which the engine does here).
    Times are absolute (epoch ns), the ``per_replica`` form.
    """
    origin, limit = _extent(comparison)
    bins = bins if bins is not None else moment_bins(comparison)
    last = origin + limit
    # Cut like the DuckDB path: nothing busy past the horizon (and no int64 overflow of a malformed value).
    start = f"least(start_ns + CAST(least(coalesce({QUEUE_SQL}, 0), {_HORIZON_S}) * 1e9 AS BIGINT), {last})"
    end = f"least(start_ns + CAST(least({E2E_SQL}, {limit / 1e9}) * 1e9 AS BIGINT), {last})"
    scan = comparison.scan_sql(f"{REPLICA_SQL} AS replica, {start} AS s, {end} AS f", f"{E2E_SQL} IS NOT NULL")
    grouped = con.sql(
        f"SELECT replica, list_sort(list(s)), list_sort(list(f)) FROM ({scan}) GROUP BY replica"
    ).to_arrow_table()
    names = [str(n) for n in grouped.column(0).to_pylist()]
    out = BusyIntervals({name: i + 1 for i, name in enumerate(sorted(names))}, origin, limit, bins)
    out.packed = False
    for row, name in enumerate(names):
        # The list values, zero-copy: 10M of them never become Python objects.
        starts, ends = (grouped.column(i)[row].values.to_numpy(zero_copy_only=False) for i in (1, 2))
        out.per_replica[name] = (starts.astype(np.int64, copy=False), ends.astype(np.int64, copy=False))
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
        if dialect_of(con) != "duckdb":
            return False  # one ClickHouse session serves the comparison; a second would not run alongside
        shadowed = con.execute("SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = 'spans'").fetchall()
        if shadowed[0][0]:
            return False
        # The moments come from the sample, built here: a cached property is no thing to race for.
        bins = moment_bins(self._comparison)
        cursor = con.cursor()
        cursor.execute("SET enable_progress_bar = false")
        future: Future[BusyIntervals] = Future()

        def run() -> None:
            try:
                future.set_result(fetch_busy_intervals(self._comparison, cursor, bins))
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
