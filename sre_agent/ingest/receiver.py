"""The receivers' write path: a bounded queue in front of one writer thread.

Every transport (OTLP/HTTP, OTLP/gRPC, the deploy-marker API) decodes its
request and calls :meth:`Writer.submit`. The writer thread is the only code
that appends to the DuckDB store; it drains the queue in batches (group
commit) and resolves each submission's future only after the batch holding
it is committed, so an acknowledgement always means "durable in the store".

Span requests are queued half decoded (:class:`~sre_agent.ingest.otlp.CollectedSpans`:
parsed, checked and counted) and the columns of a whole batch are built at
once: per-request fixed costs are then paid once a commit, and the event
loop, which also parses HTTP, does less. Building and committing are two
threads (issue 18): batch k+1 is built (Python and Arrow) while batch k is
in DuckDB, which releases the GIL, so under load a batch waits for the
larger of the two stages, not their sum. Only the commit thread touches the
store. A request whose attributes turn out not to be UTF-8 fails alone (its
batch is rebuilt one by one) with :class:`~sre_agent.errors.BadPayloadError`,
answered 400 like any bad body.

Back-pressure instead of memory growth: the queue is bounded in rows
(``Config.queue_max_spans``); a submission that does not fit raises
:class:`~sre_agent.errors.OverloadedError` carrying a ``Retry-After``
estimate, which the transports turn into 429 (HTTP) or UNAVAILABLE (gRPC).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sre_agent.errors import BadPayloadError, OverloadedError, SreAgentError, StoreError
from sre_agent.ingest.otlp_transport import TableKind

if TYPE_CHECKING:
    import pyarrow as pa

    from sre_agent.ingest.otlp import CollectedSpans
    from sre_agent.store.embedded import Store

__all__ = ["ReceiverStats", "Writer", "prometheus_family"]

log = logging.getLogger(__name__)


def prometheus_family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    """One metric family in the Prometheus text format; each sample is (``{labels}`` or ``""``, value)."""
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *(f"{name}{lb} {v:g}" for lb, v in samples)]


# Commit latency histogram bucket bounds, seconds (Prometheus-style, cumulative).
COMMIT_BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class ReceiverStats:
    """Counters about the receiver itself, exported on ``/metrics``.

    Mutated from the event loop, gRPC threads and the writer thread; every
    update goes through :meth:`add` / :meth:`count_request` under one lock.
    """

    spans_accepted: int = 0
    spans_rejected: int = 0
    metric_points_accepted: int = 0
    metric_points_rejected: int = 0
    rows_committed: dict[str, int] = field(default_factory=lambda: {"spans": 0, "metric_points": 0})
    commits: int = 0
    commit_failures: int = 0
    overloaded: int = 0
    decoder_crashes: int = 0
    commit_seconds_sum: float = 0.0
    commit_bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(COMMIT_BUCKETS_S) + 1))
    # (transport, signal, status) -> count; status is the HTTP code or gRPC code name.
    requests: dict[tuple[str, str, str], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        """Add integer deltas to the named counters."""
        with self.lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def count_request(self, transport: str, signal: str, status: str) -> None:
        """Count one finished request by transport (http|grpc), signal and status."""
        key = (transport, signal, status)
        with self.lock:
            self.requests[key] = self.requests.get(key, 0) + 1

    def observe_commit(self, seconds: float, rows: dict[str, int]) -> None:
        """Record one successful commit of ``rows`` (per table) taking ``seconds``."""
        with self.lock:
            self.commits += 1
            self.commit_seconds_sum += seconds
            index = next((i for i, bound in enumerate(COMMIT_BUCKETS_S) if seconds <= bound), len(COMMIT_BUCKETS_S))
            self.commit_bucket_counts[index] += 1
            for table, count in rows.items():
                self.rows_committed[table] = self.rows_committed.get(table, 0) + count

    def render_prometheus(self, *, queued_rows: int, queue_max_rows: int) -> str:
        """These counters in the Prometheus text exposition format (version 0.0.4)."""
        prefix = "sre_agent_receiver"
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.extend(prometheus_family(f"{prefix}_{name}", kind, help_text, samples))

        with self.lock:
            metric(
                "spans_accepted_total",
                "counter",
                "Spans accepted (acknowledged after commit).",
                [("", self.spans_accepted)],
            )
            metric(
                "spans_rejected_total",
                "counter",
                "Spans rejected as invalid (partial success).",
                [("", self.spans_rejected)],
            )
            metric(
                "metric_points_accepted_total",
                "counter",
                "Metric data points accepted.",
                [("", self.metric_points_accepted)],
            )
            metric(
                "metric_points_rejected_total",
                "counter",
                "Metric data points rejected as invalid.",
                [("", self.metric_points_rejected)],
            )
            metric(
                "overloaded_total",
                "counter",
                "Submissions refused because the queue was full.",
                [("", self.overloaded)],
            )
            metric(
                "decoder_crashes_total",
                "counter",
                "Bodies whose decoding raised an unexpected error.",
                [("", self.decoder_crashes)],
            )
            metric("commit_failures_total", "counter", "Batches whose commit failed.", [("", self.commit_failures)])
            metric(
                "rows_committed_total",
                "counter",
                "Rows appended per table (duplicates excluded).",
                [(f'{{table="{t}"}}', n) for t, n in sorted(self.rows_committed.items())],
            )
            metric("queue_rows", "gauge", "Rows waiting for the writer.", [("", queued_rows)])
            metric(
                "queue_max_rows",
                "gauge",
                "Queue bound in rows; beyond it requests get 429/UNAVAILABLE.",
                [("", queue_max_rows)],
            )
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip((*COMMIT_BUCKETS_S, float("inf")), self.commit_bucket_counts, strict=True):
                cumulative += count
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                buckets.append((f'_bucket{{le="{le}"}}', cumulative))
            lines.append(f"# HELP {prefix}_commit_seconds Time to append and commit one batch, seconds.")
            lines.append(f"# TYPE {prefix}_commit_seconds histogram")
            lines.extend(f"{prefix}_commit_seconds{suffix} {value:g}" for suffix, value in buckets)
            lines.append(f"{prefix}_commit_seconds_sum {self.commit_seconds_sum:.6f}")
            lines.append(f"{prefix}_commit_seconds_count {self.commits}")
            metric(
                "requests_total",
                "counter",
                "Finished requests by transport, signal and status.",
                [(f'{{transport="{t}",signal="{s}",code="{c}"}}', n) for (t, s, c), n in sorted(self.requests.items())],
            )
        return "\n".join(lines) + "\n"


def _merged_rows(members: list[_Item]) -> pa.Table:
    """The members' rows as one table; collected spans are built together (one pass for all)."""
    import pyarrow as pa

    from sre_agent.ingest.otlp import CollectedSpans, build_spans
    from sre_agent.store.span_rows import to_span_rows

    tables = [item.table for item in members if isinstance(item.table, pa.Table)]
    collected = [item.table for item in members if isinstance(item.table, CollectedSpans)]
    if collected:
        # In the store's form (Store.append_spans then converts nothing).
        tables.append(build_spans(collected, stored=True))
    if len(tables) == 1:
        return tables[0]
    stored = ["promoted" in table.column_names for table in tables]
    if any(stored) and not all(stored):  # canonical rows (files, the API) beside stored ones
        tables = [table if is_stored else to_span_rows(table) for table, is_stored in zip(tables, stored, strict=True)]
    return pa.concat_tables(tables, promote_options="default")


def _members(batch: list[_Item], kind: TableKind) -> list[_Item]:
    return [item for item in batch if item.kind == kind and item.table is not None]


def _built_rows(batch: list[_Item]) -> dict[str, pa.Table | BaseException]:
    """Per table, the batch's merged rows, or what building them raised (the commit thread decides)."""
    built: dict[str, pa.Table | BaseException] = {}
    kinds: tuple[TableKind, ...] = ("spans", "metric_points")
    for kind in kinds:
        members = _members(batch, kind)
        if members:
            try:
                built[kind] = _merged_rows(members)
            except Exception as exc:  # boundary: reported per request by the commit thread
                built[kind] = exc
    return built


def _failure(exc: BaseException) -> StoreError:
    """A StoreError (retryable for the client) wrapping ``exc``."""
    failure = StoreError(f"commit failed: {exc}")
    failure.__cause__ = exc
    return failure


@dataclass
class _Item:
    """One queued submission: rows to append (a table, or spans to build), or a call to run on the store."""

    kind: TableKind | Literal["call"]
    rows: int
    future: concurrent.futures.Future[Any]
    table: pa.Table | CollectedSpans | None = None
    call: Callable[[Store], Any] | None = None


class Writer:
    """The single writer: a bounded queue and the thread that drains it into the store.

    Args:
        store: the store opened for writing; only the writer thread touches
            its connection after :meth:`start`.
        queue_max_rows: bound of the queue, in rows (spans + metric points).
            A submission larger than the bound is still accepted when the
            queue is empty, so one big request cannot be refused forever.
        batch_max_rows: largest number of rows appended in one commit.
        flush_interval_s: longest time the writer holds a batch open for
            requests still being read or decoded (see :meth:`pending`); with
            nothing on its way a batch is committed at once.
        stats: counters to update (a fresh :class:`ReceiverStats` if None).
        max_pending: requests that may be read/decoded at once (see
            :meth:`pending`); beyond it :meth:`check_capacity` refuses, so
            memory held by request bodies is bounded too.
        clock: monotonic clock, seconds (injectable for tests).
    """

    def __init__(
        self,
        store: Store,
        *,
        queue_max_rows: int,
        batch_max_rows: int,
        flush_interval_s: float,
        stats: ReceiverStats | None = None,
        max_pending: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.queue_max_rows = max(1, queue_max_rows)
        self.batch_max_rows = max(1, batch_max_rows)
        self.flush_interval_s = max(0.0, flush_interval_s)
        self.stats = stats if stats is not None else ReceiverStats()
        self._clock = clock
        self._queue: collections.deque[_Item] = collections.deque()
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._committer: threading.Thread | None = None
        # Built batches on their way to the commit thread. One slot: the builder may be one
        # batch ahead, no more, so rows wait in the queue (bounded, counted) rather than here.
        self._built: queue.Queue[tuple[list[_Item], dict[str, pa.Table | BaseException]] | None] = queue.Queue(1)
        # Rows per second the writer sustained recently; feeds Retry-After.
        self._rate_rows_s = 0.0
        # Requests that passed the capacity check and are being read or decoded.
        self._pending = 0
        self.max_pending = max(1, max_pending)

    # -- producer side --------------------------------------------------

    @property
    def closing(self) -> bool:
        """True once :meth:`close` was called: new work is refused."""
        return self._closing

    @property
    def queued_rows(self) -> int:
        """Rows waiting in the queue (not yet committed)."""
        return self._queued_rows

    def retry_after_s(self) -> int:
        """Seconds a rejected client should wait: time to drain the queue, 1 to 30."""
        if self._rate_rows_s <= 0:
            return 1
        return int(min(30, max(1, round(self._queued_rows / self._rate_rows_s))))

    def check_capacity(self) -> None:
        """Raise OverloadedError when the queue is full, before a body is even read."""
        if self._closing:
            raise OverloadedError("receiver is shutting down", retry_after_s=5)
        if self._queued_rows >= self.queue_max_rows:
            self.stats.add(overloaded=1)
            raise OverloadedError(
                f"receiver queue full ({self._queued_rows} rows queued)", retry_after_s=self.retry_after_s()
            )
        if self._pending > self.max_pending:
            # Bodies being read or decoded also take memory: bound them too.
            self.stats.add(overloaded=1)
            raise OverloadedError(f"too many requests in progress ({self._pending})", retry_after_s=1)

    @contextlib.contextmanager
    def pending(self) -> Iterator[None]:
        """Mark a request as on its way (being read/decoded) so the writer waits for it briefly."""
        with self._cond:
            self._pending += 1
        try:
            yield
        finally:
            with self._cond:
                self._pending -= 1
                self._cond.notify()

    def submit(self, kind: TableKind, table: pa.Table | CollectedSpans) -> concurrent.futures.Future[int]:
        """Queue ``table`` for appending to ``kind``; the future resolves after commit.

        The future's result is ``table.num_rows`` once the batch holding the
        table is committed (rows already stored under the same key are kept
        once: ingest is idempotent). It fails with a
        :class:`~sre_agent.errors.StoreError` when the commit failed.

        Raises:
            OverloadedError: the queue cannot take ``table.num_rows`` more rows.
        """
        return self._enqueue(_Item(kind=kind, rows=table.num_rows, future=concurrent.futures.Future(), table=table))

    def submit_call(self, call: Callable[[Store], Any]) -> concurrent.futures.Future[Any]:
        """Run ``call(store)`` on the writer thread (e.g. to insert a deploy marker)."""
        return self._enqueue(_Item(kind="call", rows=0, future=concurrent.futures.Future(), call=call))

    def _enqueue(self, item: _Item) -> concurrent.futures.Future[Any]:
        with self._cond:
            if self._closing:
                raise OverloadedError("receiver is shutting down", retry_after_s=5)
            if self._queued_rows and self._queued_rows + item.rows > self.queue_max_rows:
                self.stats.add(overloaded=1)
                raise OverloadedError(
                    f"receiver queue full ({self._queued_rows} rows queued)", retry_after_s=self.retry_after_s()
                )
            self._queue.append(item)
            self._queued_rows += item.rows
            self._cond.notify()
        return item.future

    # -- lifecycle ------------------------------------------------------

    def start(self) -> None:
        """Start the build and commit threads (idempotent)."""
        if self._thread is None:
            self._committer = threading.Thread(target=self._run_commits, name="sre-agent-writer", daemon=True)
            self._committer.start()
            self._thread = threading.Thread(target=self._run, name="sre-agent-build", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float | None = None) -> None:
        """Refuse new work, commit everything queued, stop the threads. Safe to call twice."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in (self._thread, self._committer):
            if thread is not None:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    log.error("writer did not finish flushing within %.1f s", timeout_s or 0.0)
                    return
        self._thread = self._committer = None

    # -- writer thread ----------------------------------------------------

    def _take_batch(self) -> list[_Item] | None:
        """Block until work exists; return up to batch_max_rows rows of items, None when done."""
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait(0.5)
            # Linger (at most flush_interval_s) only while other requests are
            # being read or decoded: their rows then share this commit. A lone
            # sequential client never waits.
            linger_until = self._clock() + self.flush_interval_s
            while self._pending and self._queued_rows < self.batch_max_rows and not self._closing:
                remaining = linger_until - self._clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch: list[_Item] = []
            rows = 0
            while self._queue and (not batch or rows + self._queue[0].rows <= self.batch_max_rows):
                item = self._queue.popleft()
                batch.append(item)
                rows += item.rows
            return batch

    def _run(self) -> None:
        """The build thread: take a batch, build its rows, hand both to the commit thread."""
        try:
            while True:
                batch = self._take_batch()
                if batch is None:
                    return
                self._built.put((batch, _built_rows(batch)))
        finally:
            self._built.put(None)

    def _run_commits(self) -> None:
        """The commit thread: the only one that touches the store."""
        while True:
            built = self._built.get()
            if built is None:
                return
            self._commit(*built)

    def _commit(self, batch: list[_Item], built: dict[str, pa.Table | BaseException]) -> None:
        started = self._clock()
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        rows_by_table: dict[str, int] = {}
        appenders: tuple[tuple[TableKind, Callable[[pa.Table], int]], ...] = (
            ("spans", self.store.append_spans),
            ("metric_points", self.store.append_metric_points),
        )
        for kind, append in appenders:
            members = _members(batch, kind)
            if members:
                rows_by_table[kind] = self._append(append, members, results, errors, built.get(kind))
        for item in batch:
            if item.call is not None:
                try:
                    results[id(item)] = item.call(self.store)
                except Exception as exc:  # boundary: the writer thread must survive a failing call
                    log.exception("writer call failed")
                    errors[id(item)] = exc if isinstance(exc, SreAgentError) else _failure(exc)
        elapsed = self._clock() - started
        committed = sum(rows_by_table.values())
        batch_rows = sum(item.rows for item in batch)
        if elapsed > 0 and batch_rows:
            rate = batch_rows / elapsed
            self._rate_rows_s = rate if self._rate_rows_s == 0 else 0.8 * self._rate_rows_s + 0.2 * rate
        self.stats.observe_commit(elapsed, rows_by_table)
        log.debug("committed %d rows (%d new) in %.3f s", batch_rows, committed, elapsed)
        self._finish(batch, results, errors)

    def _append(
        self,
        append: Callable[[pa.Table], int],
        members: list[_Item],
        results: dict[int, Any],
        errors: dict[int, BaseException],
        built: pa.Table | BaseException | None = None,
    ) -> int:
        """Append the members' rows as one batch; returns rows newly inserted.

        ``built`` is the members' merged rows, or the error building them
        raised (None: build them here). When the merged append fails, each
        request is retried alone so that one bad request fails only itself,
        not the requests it was batched with.
        """
        try:
            if isinstance(built, BaseException):
                raise built
            inserted = append(_merged_rows(members) if built is None else built)
        except Exception as exc:  # boundary: a failed commit fails its requests, never the writer thread
            if len(members) > 1:
                log.warning("append of %d batched requests failed (%s); retrying one by one", len(members), exc)
                return sum(self._append(append, [item], results, errors) for item in members)
            if isinstance(exc, BadPayloadError):  # the client's bytes, found while building: not a commit failure
                errors[id(members[0])] = exc
                return 0
            log.error("append of one request (%d rows) failed: %s", members[0].rows, exc)
            self.stats.add(commit_failures=1)
            errors[id(members[0])] = _failure(exc)
            return 0
        # Each request is acknowledged with its own row count (the store only
        # reports new rows for the merged batch).
        for item in members:
            results[id(item)] = item.rows
        return int(inserted)

    def _finish(self, batch: list[_Item], results: dict[int, Any], errors: dict[int, BaseException]) -> None:
        with self._cond:
            self._queued_rows -= sum(item.rows for item in batch)
        for item in batch:
            error = errors.get(id(item))
            if error is not None:
                item.future.set_exception(error)
            else:
                item.future.set_result(results.get(id(item)))
