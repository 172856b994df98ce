"""Optional decoding of OTLP bodies in worker processes (``sre-agent serve --decode-workers N``).

Flattening OTLP into Arrow is Python code that holds the GIL; in-process it
competes with the event loop (HTTP parsing) and the writer thread (DuckDB
appends). With workers, the server process only moves bytes and Arrow
buffers: each worker decodes with its own :class:`~sre_agent.ingest.normalise.Normaliser`
(same settings and hash key) and hands the table back as Arrow IPC.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sre_agent.errors import OverloadedError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DecodePool", "DecodedInWorker"]

log = logging.getLogger(__name__)

_NORMALISER: Any = None  # the worker process's own Normaliser, set by _init_worker


@dataclass(frozen=True)
class DecodedInWorker:
    """A decoded body as the receivers use it (same attributes as ``DecodedSpans``)."""

    table: pa.Table
    rejected: int
    errors: tuple[str, ...]


def _exit_when_orphaned(parent_pid: int) -> None:
    """Worker watchdog: a SIGKILLed server cannot stop its workers, so they stop themselves."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _init_worker(parent_pid: int, keep_content: bool, max_attribute_bytes: int, hash_key: bytes) -> None:
    global _NORMALISER  # noqa: PLW0603 - one normaliser per worker process, built once
    from sre_agent.ingest.normalise import Normaliser

    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    _NORMALISER = Normaliser(keep_content=keep_content, max_attribute_bytes=max_attribute_bytes, hash_key=hash_key)


def _decode_in_worker(signal: str, body: bytes, media_type: str) -> tuple[bytes, int, tuple[str, ...]]:
    import pyarrow as pa

    from sre_agent.ingest.otlp_transport import decode_payload

    decoded = decode_payload(signal, body, media_type, _NORMALISER, stored=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, decoded.table.schema) as stream:
        stream.write_table(decoded.table)
    return sink.getvalue().to_pybytes(), int(decoded.rejected), tuple(decoded.errors)


def _unpack(wire: tuple[bytes, int, tuple[str, ...]]) -> DecodedInWorker:
    import pyarrow as pa

    payload, rejected, errors = wire
    return DecodedInWorker(pa.ipc.open_stream(payload).read_all(), rejected, errors)


class DecodePool:
    """``workers`` spawned processes decoding OTLP bodies.

    Args:
        workers: number of worker processes (at least 1).
        keep_content, max_attribute_bytes, hash_key: the Normaliser settings
            every worker uses (the same as the in-process normaliser's).
    """

    def __init__(self, workers: int, *, keep_content: bool, max_attribute_bytes: int, hash_key: bytes) -> None:
        self.workers = max(1, workers)
        self._initargs = (os.getpid(), keep_content, max_attribute_bytes, hash_key)
        self._lock = threading.Lock()
        self._executor = self._new_executor()

    def _new_executor(self) -> concurrent.futures.ProcessPoolExecutor:
        # spawn, not fork: the server has threads (writer, gRPC) that fork would copy mid-state.
        return concurrent.futures.ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=self._initargs,
        )

    def warm_up(self) -> None:
        """Start every worker now (spawning takes seconds) rather than on the first request."""
        empty = ("traces", b"", "application/x-protobuf")  # imports the decoder in each worker
        concurrent.futures.wait([self._executor.submit(_decode_in_worker, *empty) for _ in range(self.workers)])

    def submit(self, signal: str, body: bytes, media_type: str) -> concurrent.futures.Future[DecodedInWorker]:
        """Decode ``body`` in a worker; the future yields a :class:`DecodedInWorker`.

        The future fails with the decoder's own errors (``BadPayloadError``).

        Raises:
            OverloadedError: a worker died; the pool is being restarted.
        """
        result: concurrent.futures.Future[DecodedInWorker] = concurrent.futures.Future()
        try:
            inner = self._executor.submit(_decode_in_worker, signal, body, media_type)
        except BrokenProcessPool as exc:
            self._restart()
            raise OverloadedError("a decode worker died; restarting the pool", retry_after_s=1) from exc

        def done(future: concurrent.futures.Future[tuple[bytes, int, tuple[str, ...]]]) -> None:
            error = future.exception()
            if isinstance(error, BrokenProcessPool):
                self._restart()
                result.set_exception(OverloadedError("a decode worker died; retry", retry_after_s=1))
            elif error is not None:
                result.set_exception(error)
            else:
                result.set_result(_unpack(future.result()))

        inner.add_done_callback(done)
        return result

    def _restart(self) -> None:
        with self._lock:
            log.error("decode worker pool broken; starting a new one")
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._new_executor()

    def close(self) -> None:
        """Stop the workers (safe to call twice)."""
        self._executor.shutdown(wait=True, cancel_futures=True)
