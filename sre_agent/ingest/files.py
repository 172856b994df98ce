"""Load telemetry files into a store (``sre-agent ingest``).

Formats, detected from the content (not the file name):

* OTel Collector file-exporter **JSON lines**: one ``{"resourceSpans":[...]}``
  or ``{"resourceMetrics":[...]}`` object per line;
* a single OTLP/JSON **document**, possibly pretty-printed over many lines
  (e.g. ``examples/trace.json`` of opentelemetry-proto);
* the file exporter's **length-prefixed protobuf** form: a 4-byte big-endian
  length, then an ``ExportTraceServiceRequest`` or
  ``ExportMetricsServiceRequest`` (each message is tried as traces, then
  metrics);
* any of these **gzip**-compressed (detected by the gzip magic bytes).

Files are streamed: memory is bounded by the body cap (one line or message
at a time, 64 MiB by default) plus one store batch, whatever the file size.
A line or message longer than the cap is rejected without being held in
memory, which also defuses gzip bombs. A bad line is reported with its
number and skipped; the good lines around it are still ingested. Timestamps
are not checked against any retention: old incident files load as they are.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import pyarrow as pa

from sre_agent.errors import BadPayloadError
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import DecodedMetrics, DecodedSpans, decode_json_document, decode_metrics, decode_traces
from sre_agent.store.embedded import Store

__all__ = ["FileResult", "ProgressCallback", "Sink", "ingest_files", "read_files"]

MiB = 1024 * 1024
MAX_REPORTED = 20  # bad lines listed per file; the count is always exact
NOT_TELEMETRY = (
    "not a telemetry file (expected OTLP JSON lines, one OTLP JSON document or "
    "length-prefixed OTLP protobuf, each optionally gzip-compressed)"
)
# Both ExportTraceServiceRequest and ExportMetricsServiceRequest start with their
# field 1 (resource_spans / resource_metrics), length-delimited: tag byte 0x0A.
_OTLP_REQUEST_TAG = 0x0A
_PROTOBUF = "application/x-protobuf"
_WHITESPACE = b" \t\r\n"

ProgressCallback = Callable[[str, int, int], None]
"""``progress(path, bytes_done, bytes_total)``: bytes of the file as stored (compressed)."""


@dataclass
class FileResult:
    """What happened to one input file.

    Attributes:
        path: the file as given.
        format: ``jsonl``, ``json``, ``protobuf`` (with ``+gzip`` when compressed), or ``None``.
        spans: spans decoded and handed to the store.
        points: metric points decoded and handed to the store.
        inserted: rows newly stored (spans + points).
        duplicates: rows already in the store (re-sent or re-ingested), skipped.
        rejected: spans/points rejected one by one plus bad lines or messages.
        bad_lines: up to 20 ``(line or message number, reason)`` pairs, 1-based.
        error: a reason the file could not be read at all (missing, unreadable), else ``None``.
    """

    path: str
    format: str | None = None
    spans: int = 0
    points: int = 0
    inserted: int = 0
    duplicates: int = 0
    rejected: int = 0
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the whole file was readable and nothing in it was rejected."""
        return self.error is None and self.rejected == 0

    def bad(self, number: int, reason: str, count: int = 1) -> None:
        """Record ``count`` rejected items at line/message ``number``."""
        self.rejected += count
        if len(self.bad_lines) < MAX_REPORTED:
            self.bad_lines.append((number, reason))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form used by ``sre-agent ingest --format json``."""
        return {
            "path": self.path,
            "format": self.format,
            "spans": self.spans,
            "points": self.points,
            "inserted": self.inserted,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "bad_lines": [{"line": n, "reason": r} for n, r in self.bad_lines],
            "error": self.error,
        }


class _Batcher:
    """Collects decoded tables and appends them to the store in large batches."""

    def __init__(self, store: Store, batch_rows: int) -> None:
        self.store = store
        self.batch_rows = batch_rows
        self.spans: list[pa.Table] = []
        self.points: list[pa.Table] = []
        self.pending = 0

    def add(self, decoded: DecodedSpans | DecodedMetrics, result: FileResult) -> None:
        rows = decoded.table.num_rows
        if isinstance(decoded, DecodedSpans):
            result.spans += rows
            self.spans.append(decoded.table)
        else:
            result.points += rows
            self.points.append(decoded.table)
        self.pending += rows
        if self.pending >= self.batch_rows:
            self.flush(result)

    def flush(self, result: FileResult) -> None:
        inserted = 0
        total = 0
        if self.spans:
            table = pa.concat_tables(self.spans)
            total += table.num_rows
            inserted += self.store.append_spans(table)
        if self.points:
            table = pa.concat_tables(self.points)
            total += table.num_rows
            inserted += self.store.append_metric_points(table)
        result.inserted += inserted
        result.duplicates += total - inserted
        self.spans, self.points, self.pending = [], [], 0


class _Progress:
    """Reports the raw (compressed) position of the file at most every ~1 MiB."""

    def __init__(self, raw: IO[bytes], path: str, callback: ProgressCallback | None, total: int) -> None:
        self.raw, self.path, self.callback, self.total = raw, path, callback, total
        self.last = -MiB

    def __call__(self, final: bool = False) -> None:
        if self.callback is None:
            return
        done = self.total if final else self.raw.tell()
        if final or done - self.last >= MiB:
            self.last = done
            self.callback(self.path, done, self.total)


def ingest_files(
    paths: Iterable[str | Path],
    store: Store,
    normaliser: Normaliser,
    progress: ProgressCallback | None = None,
    *,
    max_body_bytes: int = 64 * MiB,
    batch_rows: int = 50_000,
) -> list[FileResult]:
    """Ingest telemetry files into ``store``; one :class:`FileResult` per path, in order.

    Args:
        paths: files to read (see the module docstring for formats).
        store: an open, writable store.
        normaliser: attribute mapping and privacy settings.
        progress: called as ``progress(path, bytes_done, bytes_total)`` while reading.
        max_body_bytes: the cap on one line, document or message after decompression.
        batch_rows: rows collected before one append to the store.

    A missing or unreadable file gets ``error`` set; the other files are still read.
    """
    return read_files(
        paths,
        lambda: _StoreSink(store, normaliser, batch_rows),
        progress,
        max_body_bytes=max_body_bytes,
    )


class Sink(Protocol):
    """Where the readers hand what they read: the local store, or a running server."""

    def document(self, document: Any, number: int, result: FileResult) -> None:
        """One parsed OTLP/JSON document (a line, or a whole file)."""

    def message(self, payload: bytes, number: int, result: FileResult) -> None:
        """One length-prefixed protobuf message."""

    def flush(self, result: FileResult) -> None:
        """End of a file: commit what is pending."""


class _StoreSink:
    """Decode locally and append to the store in large batches."""

    def __init__(self, store: Store, norm: Normaliser, batch_rows: int) -> None:
        self.batcher = _Batcher(store, batch_rows)
        self.norm = norm

    def document(self, document: Any, number: int, result: FileResult) -> None:
        try:
            decoded = decode_json_document(document, self.norm)
        except BadPayloadError as exc:
            result.bad(number, str(exc))
            return
        self._accept(decoded, number, result)

    def message(self, payload: bytes, number: int, result: FileResult) -> None:
        try:
            decoded = _decode_message(payload, self.norm)
        except BadPayloadError as exc:
            result.bad(number, str(exc))
            return
        self._accept(decoded, number, result)

    def _accept(self, decoded: DecodedSpans | DecodedMetrics, number: int, result: FileResult) -> None:
        if decoded.rejected:
            what = "spans" if isinstance(decoded, DecodedSpans) else "points"
            reason = decoded.errors[0] if decoded.errors else "rejected"
            result.bad(number, f"{decoded.rejected} {what} rejected: {reason}", count=decoded.rejected)
        self.batcher.add(decoded, result)

    def flush(self, result: FileResult) -> None:
        self.batcher.flush(result)


@dataclass
class _Context:
    """What every reader of one file needs.

    ``json_lines`` counts lines that parsed as JSON and ``not_a_document`` says the
    whole file, read within the cap, is no JSON document either: a file starting
    with ``{`` for which both hold is no telemetry file, only text that looks like it.
    """

    result: FileResult
    sink: Sink
    cap: int
    report: _Progress
    json_lines: int = 0
    not_a_document: bool = False


def read_files(
    paths: Iterable[str | Path],
    sink_for: Callable[[], Sink],
    progress: ProgressCallback | None = None,
    *,
    max_body_bytes: int = 64 * MiB,
) -> list[FileResult]:
    """Read each file and hand its documents/messages to a fresh sink; one result per path."""
    results: list[FileResult] = []
    for path in paths:
        result = FileResult(str(path))
        results.append(result)
        try:
            _read_one(Path(path), result, sink_for(), progress=progress, cap=max_body_bytes)
        except FileNotFoundError:
            result.error = "no such file"
        except IsADirectoryError:
            result.error = "is a directory"
        except PermissionError:
            result.error = "permission denied"
        except (OSError, EOFError, zlib.error) as exc:
            # gzip.BadGzipFile, truncated gzip streams and read errors all land here.
            result.error = f"cannot read: {exc}"
    return results


def _read_one(path: Path, result: FileResult, sink: Sink, *, progress: ProgressCallback | None, cap: int) -> None:
    with path.open("rb") as raw:
        total = path.stat().st_size
        report = _Progress(raw, str(path), progress, total)
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream: io.BufferedReader = (
            io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), MiB) if compressed else io.BufferedReader(raw, MiB)
        )
        head = stream.peek(64)[:64].lstrip(_WHITESPACE)
        ctx = _Context(result, sink, cap, report)
        try:
            if not head:
                result.format = "empty"
            elif head[:1] in (b"{", b"["):
                result.format = _read_json(stream, ctx)
            else:
                result.format = "protobuf"
                _read_length_prefixed(stream, ctx)
            if ctx.not_a_document and ctx.json_lines == 0 and result.rejected:
                _not_telemetry(result)
        finally:
            # Whatever was decoded before a read error is still committed.
            sink.flush(result)
        if compressed and result.format:
            result.format += "+gzip"
        report(final=True)


# ---------------------------------------------------------------- JSON


def _read_json(stream: IO[bytes], ctx: _Context) -> str:
    """JSON lines, or one (pretty-printed) document; returns the format name."""
    cap = ctx.cap
    first = stream.readline(cap + 1)
    if _complete_json_line(first):
        _read_lines(_chain_lines(first, stream, cap), ctx)
        return "jsonl"
    # A document spread over lines: read it whole, within the cap.
    rest = stream.read(cap + 1 - len(first)) if len(first) <= cap else b""
    buffer = first + rest
    if len(buffer) <= cap:
        try:
            document = json.loads(buffer)
        except (ValueError, RecursionError):
            document = None
        if document is not None:
            ctx.sink.document(document, 1, ctx.result)
            return "json"
        ctx.not_a_document = True
    # Not one document either: treat it as JSON lines and report the bad ones.
    _read_lines(_chain_lines(buffer, stream, cap), ctx)
    return "jsonl"


def _complete_json_line(line: bytes) -> bool:
    text = line.strip()
    if not (text.startswith(b"{") and text.endswith(b"}")):
        return False
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


class _PrefixedRaw(io.RawIOBase):
    """A raw stream reading ``prefix`` first, then ``stream``."""

    def __init__(self, prefix: bytes, stream: IO[bytes]) -> None:
        self._prefix = memoryview(prefix)
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        data = self._stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _chain_lines(prefix: bytes, stream: IO[bytes], cap: int) -> Iterator[bytes | None]:
    """Lines of ``prefix`` followed by the stream; ``None`` for a line over the cap.

    An over-long line is skipped in chunks, never held whole in memory.
    """
    reader = io.BufferedReader(_PrefixedRaw(prefix, stream), MiB)
    while True:
        line = reader.readline(cap + 1)
        if not line:
            return
        if len(line) > cap:
            while line and not line.endswith(b"\n"):
                line = reader.readline(MiB)
            yield None
            continue
        yield line


def _read_lines(lines: Iterator[bytes | None], ctx: _Context) -> None:
    for number, line in enumerate(lines, start=1):
        if line is None:
            ctx.result.bad(number, "line longer than the body cap; skipped")
            continue
        text = line.strip()
        if not text:
            continue
        try:
            document = json.loads(text)
        except UnicodeDecodeError:
            ctx.result.bad(number, "not valid UTF-8")
            continue
        except (ValueError, RecursionError) as exc:
            ctx.result.bad(number, f"invalid JSON: {exc}")
            continue
        ctx.json_lines += 1
        ctx.sink.document(document, number, ctx.result)
        if number % 64 == 0:
            ctx.report()


# ---------------------------------------------------------------- protobuf


def _read_length_prefixed(stream: IO[bytes], ctx: _Context) -> None:
    result, cap = ctx.result, ctx.cap
    number = 0
    while True:
        header = stream.read(4)
        if not header:
            return
        number += 1
        if len(header) < 4:
            result.bad(number, "truncated length prefix at end of file")
            return
        length = int.from_bytes(header, "big")
        if number == 1 and not _plausible_first_message(stream, length, cap):
            # Text, random bytes or another binary format: its first bytes make no OTLP message.
            _not_telemetry(result)
            return
        if length == 0 or length > cap:
            # The stream cannot be resynchronised after a bad length: stop here.
            reason = "zero-length message" if length == 0 else f"message of {length} bytes exceeds the cap of {cap}"
            result.bad(number, f"{reason}; the rest of the file is not read")
            return
        payload = stream.read(length)
        if len(payload) < length:
            result.bad(number, f"truncated message ({len(payload)} of {length} bytes)")
            return
        ctx.sink.message(payload, number, result)
        ctx.report()


def _plausible_first_message(stream: IO[bytes], length: int, cap: int) -> bool:
    """Whether a length prefix and the byte after it can start an OTLP export request.

    Any text's first four bytes read as a length over 500 MB, past the cap;
    random bytes fail the length or the tag test all but about once in 20,000.
    """
    if length == 0 or length > cap:
        return False
    peek = getattr(stream, "peek", None)
    first = peek(1)[:1] if peek is not None else b""
    return not first or first[0] == _OTLP_REQUEST_TAG


def _not_telemetry(result: FileResult) -> None:
    """Mark the whole file as not telemetry: one reason instead of a list of bad lines."""
    result.error = NOT_TELEMETRY
    result.format = None
    result.rejected = 0
    result.bad_lines.clear()


def _decode_message(payload: bytes, norm: Normaliser) -> DecodedSpans | DecodedMetrics:
    """A length-prefixed message is a traces or a metrics request: try traces first.

    The two requests are wire-compatible at the top level, so a metrics
    message can parse as traces; it then yields no span with valid ids,
    and the metrics parse decides.
    """
    spans: DecodedSpans | None = None
    first_error: BadPayloadError | None = None
    try:
        spans = decode_traces(payload, _PROTOBUF, normaliser=norm)
    except BadPayloadError as exc:
        first_error = exc
    if spans is not None and spans.table.num_rows:
        return spans
    try:
        metrics = decode_metrics(payload, _PROTOBUF, normaliser=norm)
    except BadPayloadError:
        metrics = None
    if metrics is not None and (metrics.table.num_rows or metrics.rejected):
        return metrics
    if spans is not None:
        return spans
    if metrics is not None:
        return metrics
    assert first_error is not None
    raise first_error
