"""Flatten a parsed (lite) ``ExportTraceServiceRequest`` into the canonical spans table.

The per-span Python loop only copies the span's own fields and hands its
raw attribute bytes to :func:`sre_agent.ingest.attrs.decode_attributes`; the
canonical columns are then resolved for the whole batch with array
operations, following :data:`sre_agent.store.schema.SPAN_ATTRIBUTE_SOURCES`: the
first present key wins, span attributes before resource attributes, except
for :data:`~sre_agent.store.schema.RESOURCE_FIRST_COLUMNS` where the resource wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError
from opentelemetry.proto.trace.v1 import trace_pb2

from sre_agent.errors import BadPayloadError
from sre_agent.ingest.attrs import KIND_DOUBLE, KIND_INT, Attributes, decode_attributes
from sre_agent.ingest.normalise import (
    CANONICAL_COLUMNS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    Normaliser,
    any_value_to_python,
    first_finish_reason,
)
from sre_agent.store.schema import (
    ENGINE_SPAN_NAMES,
    INT32_BOUND,
    PROMOTED_KEYS,
    QUEUE_TOLERANCE_S,
    RESOURCE_FIRST_COLUMNS,
    SPAN_ATTRIBUTE_SOURCES,
    spans_arrow_schema,
)
from sre_agent.store.span_rows import reproduced_entries, split_promoted

__all__ = ["MAX_ERRORS", "CollectedSpans", "build_spans", "collect_spans", "flatten_spans"]

MAX_ERRORS = 5  # reasons kept per batch; the count is always exact
_SPAN_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
_STATUS_CODES = ("unset", "ok", "error")
_NS_LIMIT = 1 << 63  # fixed64 times beyond int64 (year 2262) cannot be stored
_ARROW_TYPES = {f.name: f.type for f in spans_arrow_schema()}
# Typed constants for compute calls: a bare Python scalar makes Arrow infer
# its type, which tries (and, without python-dateutil, fails) an import on
# every call, about 0.5 ms each.
_ENGINE_NAMES = pa.array(sorted(ENGINE_SPAN_NAMES), pa.string())
_KIND_NAMES = pa.array(_SPAN_KINDS, pa.string())
_CODE_NAMES = pa.array(_STATUS_CODES, pa.string())
_NULL_STRING = pa.scalar(None, pa.string())
_EMPTY = pa.scalar("", pa.string())
_ONE = pa.scalar(1, pa.int64())
_NS_PER_S = pa.scalar(1e9, pa.float64())
_NULL_FLOAT = pa.scalar(None, pa.float64())
_ZERO_S = pa.scalar(0.0, pa.float64())
_QUEUE_TOLERANCE_S = pa.scalar(-QUEUE_TOLERANCE_S, pa.float64())
# Keys whose double values only a float column reads (numbers, never the spelled text), so the
# stored form may leave them unspelled until it knows which ones stay in the map.
_DEFERRED_DOUBLES = frozenset(key for key, column in PROMOTED_KEYS if column in FLOAT_COLUMNS) - frozenset(
    key for column, keys in SPAN_ATTRIBUTE_SOURCES.items() if column not in FLOAT_COLUMNS for key in keys
)


class _Batch:
    """What the span loop collects: one Python list per span field, in arrival order.

    Fields are appended as upb returns them (bytes ids, int times and codes);
    validation, hex spelling and lookups run afterwards on whole arrays.
    """

    def __init__(self) -> None:
        self.trace_ids: list[bytes] = []
        self.span_ids: list[bytes] = []
        self.parents: list[bytes] = []
        self.names: list[str] = []
        self.kinds: list[int] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.codes: list[int] = []
        self.messages: list[str] = []
        self.attributes: list[Any] = []  # each span's repeated ``bytes`` container (raw KeyValue messages)
        self.event_errors: dict[int, str] = {}  # span index -> error type from events/status
        self.scopes: list[tuple[int, str | None]] = []  # (spans so far, scope name)
        self.resource_slots: list[tuple[int, list[Any]]] = []  # (spans so far, canonical values)
        self.resource_maps: list[tuple[int, list[str], list[str]]] = []  # (spans so far, keys, values)


class CollectedSpans:
    """One request's spans, read and checked but not yet columnar (see :func:`collect_spans`).

    What a receiver must know before queueing a request is known here: how
    many spans will be stored (``num_rows``), and the rejected ones with their
    reasons. Building the columns (:func:`build_spans`) can wait and be done
    for several requests at once, which costs less per span.
    """

    def __init__(self, batch: _Batch, valid: np.ndarray, errors: list[str], normaliser: Normaliser) -> None:
        self.batch = batch
        self.valid = valid
        self.num_rows = int(np.count_nonzero(valid))
        self.rejected = int(valid.size) - self.num_rows
        self.errors = errors
        self.normaliser = normaliser


def collect_spans(request: Any, norm: Normaliser) -> CollectedSpans:
    """Read a request parsed with the lite classes: its spans' fields, validity and rejection reasons."""
    batch = _collect(request, norm)
    valid = _valid_spans(batch)
    errors: list[str] = []
    if not valid.all():
        spans = [
            span
            for resource_spans in request.resource_spans
            for scope in resource_spans.scope_spans
            for span in scope.spans
        ]
        errors = [_rejection(spans[i]) for i in np.flatnonzero(~valid)[:MAX_ERRORS].tolist()]
    return CollectedSpans(batch, valid, errors, norm)


def build_spans(parts: Sequence[CollectedSpans], *, stored: bool = False) -> pa.Table:
    """The canonical table of the valid spans of ``parts``, in order, built in one pass.

    With ``stored``, the table is in the store's ``span_rows`` form instead
    (what :func:`sre_agent.store.span_rows.to_span_rows` makes of the canonical
    table, decided here from the decoded values, without spelling numbers).

    Raises:
        BadPayloadError: an attribute is not valid UTF-8 (the parts cannot
            tell which one; build them one by one to find it).
    """
    if not parts:
        raise ValueError("build_spans needs at least one part")
    if len(parts) == 1:
        return _table(parts[0].batch, parts[0].normaliser, parts[0].valid, stored=stored)
    valid = np.concatenate([part.valid for part in parts])
    return _table(_merged([part.batch for part in parts]), parts[0].normaliser, valid, stored=stored)


def flatten_spans(request: Any, norm: Normaliser) -> tuple[pa.Table, int, list[str]]:
    """Return ``(table, rejected, errors)`` for a request parsed with the lite classes."""
    collected = collect_spans(request, norm)
    return build_spans([collected]), collected.rejected, collected.errors


def _merged(batches: Sequence[_Batch]) -> _Batch:
    """One batch holding ``batches`` in order (run starts and span indexes shifted)."""
    merged = _Batch()
    for batch in batches:
        base = len(merged.starts)
        merged.trace_ids += batch.trace_ids
        merged.span_ids += batch.span_ids
        merged.parents += batch.parents
        merged.names += batch.names
        merged.kinds += batch.kinds
        merged.starts += batch.starts
        merged.ends += batch.ends
        merged.codes += batch.codes
        merged.messages += batch.messages
        merged.attributes += batch.attributes
        merged.event_errors.update({base + i: error for i, error in batch.event_errors.items()})
        merged.scopes += [(base + first, name) for first, name in batch.scopes]
        merged.resource_slots += [(base + first, values) for first, values in batch.resource_slots]
        merged.resource_maps += [(base + first, keys, values) for first, keys, values in batch.resource_maps]
    return merged


def _collect(request: Any, norm: Normaliser) -> _Batch:
    """The per-span loop: only field reads and list appends (~10 upb accesses a span)."""
    batch = _Batch()
    trace_ids, span_ids, parents = batch.trace_ids.append, batch.span_ids.append, batch.parents.append
    names, kinds, starts, ends = batch.names.append, batch.kinds.append, batch.starts.append, batch.ends.append
    codes, messages, attributes = batch.codes.append, batch.messages.append, batch.attributes.append
    event_errors = batch.event_errors
    count = 0
    for resource_spans in request.resource_spans:
        res_keys, res_values, res_slot, _ = norm.resource_entries(resource_spans.resource.attributes)
        batch.resource_slots.append((count, res_slot))
        batch.resource_maps.append((count, res_keys, res_values))
        for scope_spans in resource_spans.scope_spans:
            batch.scopes.append((count, scope_spans.scope.name or None))
            for span in scope_spans.spans:
                trace_ids(span.trace_id)
                span_ids(span.span_id)
                parents(span.parent_span_id)
                names(span.name)
                kinds(span.kind)
                starts(span.start_time_unix_nano)
                ends(span.end_time_unix_nano)
                status = span.status  # raw Status bytes, b"" when unset (the lite class)
                code, message = _status(status) if status else (0, "")
                codes(code)
                messages(message)
                attributes(span.attributes)
                events = span.events  # raw Event messages
                if code == 2 or events:
                    error = _event_error_type(events) or ("error" if code == 2 else None)
                    if error is not None:
                        event_errors[count] = error
                count += 1
    return batch


def _valid_spans(batch: _Batch) -> np.ndarray:
    """Per span, whether its ids have OTLP's lengths and its start fits int64 (the rest is rejected)."""
    n = len(batch.starts)
    if n == 0:
        return np.zeros(0, bool)
    trace = _lengths(batch.trace_ids)
    span = _lengths(batch.span_ids)
    parent = _lengths(batch.parents)
    starts = np.fromiter(batch.starts, np.uint64, n)
    valid: np.ndarray = (trace == 16) & (span == 8) & ((parent == 0) | (parent == 8)) & (starts < np.uint64(_NS_LIMIT))
    return valid


def _lengths(values: list[bytes]) -> np.ndarray:
    return np.fromiter(map(len, values), np.int64, len(values))


def _rejection(span: Any) -> str:
    if span.start_time_unix_nano >= _NS_LIMIT:
        return f"span {span.name!r}: start time {span.start_time_unix_nano} is beyond 2262"
    return (
        f"span {span.name!r}: bad id lengths (trace_id {len(span.trace_id)} bytes, "
        f"span_id {len(span.span_id)} bytes, parent_span_id {len(span.parent_span_id)} bytes)"
    )


def _status(raw: bytes) -> tuple[int, str]:
    """``(code, message)`` of a serialized ``Status``."""
    try:
        status = trace_pb2.Status.FromString(raw)
    except DecodeError as exc:
        raise BadPayloadError(f"cannot parse OTLP protobuf: span status: {exc}") from exc
    return status.code, status.message


def _event_error_type(events: Any) -> str | None:
    """The ``exception.type`` of the first exception event among serialized ``Span.Event`` messages.

    Every event is parsed, so a malformed one fails the request as the full parser did.
    """
    try:
        parsed = [trace_pb2.Span.Event.FromString(raw) for raw in events]
    except DecodeError as exc:
        raise BadPayloadError(f"cannot parse OTLP protobuf: span event: {exc}") from exc
    for event in parsed:
        if event.name == "exception":
            for kv in event.attributes:
                if kv.key == "exception.type":
                    return str(any_value_to_python(kv.value))
    return None


def _table(batch: _Batch, norm: Normaliser, valid: np.ndarray, *, stored: bool = False) -> pa.Table:
    everything = bool(valid.all())
    kept = np.flatnonzero(valid)
    n = int(kept.size)
    # before[i]: spans kept among the first i received, so that positions counted
    # while collecting (resources, scopes, event errors) index the kept rows.
    before = np.concatenate([[0], np.cumsum(valid)]).astype(np.int64)
    raw_attributes = batch.attributes if everything else [batch.attributes[i] for i in kept.tolist()]
    lists = pa.array(raw_attributes, pa.list_(pa.binary())) if n else pa.array([], pa.list_(pa.binary()))
    # The stored form keeps a latency sent as a double once, in its column: spell those doubles
    # only where the column does not reproduce them (after _reproduced_entries).
    attrs = decode_attributes(lists.values, norm, _DEFERRED_DOUBLES if stored else frozenset())
    offsets = np.frombuffer(lists.offsets.buffers()[1], np.int32, count=n + 1).astype(np.int64)
    span_of_attr = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
    mask = None if everything else pa.array(valid)
    parents = _hex(batch.parents, mask)
    parent_missing = pc.equal(pc.binary_length(parents), pa.scalar(0, pa.int32()))
    starts = _kept(np.fromiter(batch.starts, np.uint64, valid.size), kept, everything).astype(np.int64)
    ends = _kept(np.fromiter(batch.ends, np.uint64, valid.size), kept, everything)
    end_ok = (ends > 0) & (ends < np.uint64(_NS_LIMIT))
    kinds = _kept(np.fromiter(batch.kinds, np.int64, valid.size), kept, everything)
    codes = _kept(np.fromiter(batch.codes, np.int64, valid.size), kept, everything)
    messages = _strings(batch.messages, mask)
    columns: dict[str, Any] = {
        "trace_id": _hex(batch.trace_ids, mask),
        "span_id": _hex(batch.span_ids, mask),
        "parent_span_id": pc.if_else(parent_missing, _NULL_STRING, parents),
        "name": _strings(batch.names, mask),
        "kind": _KIND_NAMES.take(pa.array(np.where((kinds >= 0) & (kinds < len(_SPAN_KINDS)), kinds, 0))),
        "start_ns": pa.array(starts, pa.int64()),
        "end_ns": pa.array(np.where(end_ok, ends, 0).astype(np.int64), pa.int64(), mask=~end_ok),
        "status_code": _CODE_NAMES.take(pa.array(np.where((codes >= 0) & (codes < len(_STATUS_CODES)), codes, 0))),
        "status_message": pc.if_else(pc.equal(messages, _EMPTY), _NULL_STRING, messages),
        "scope_name": _repeat([(int(before[first]), name) for first, name in batch.scopes], n, pa.string()),
    }
    key_index = {name: i for i, name in enumerate(attrs.key_names)}
    resource_slots = [(int(before[first]), values) for first, values in batch.resource_slots]
    for slot, name in enumerate(CANONICAL_COLUMNS):
        chosen = _choose(SPAN_ATTRIBUTE_SOURCES[name], attrs, key_index, span_of_attr, n)
        from_spans = _typed(name, chosen, attrs)
        from_resource = _resource_column(name, slot, resource_slots, n)
        if from_resource is None:
            columns[name] = from_spans
        elif name in RESOURCE_FIRST_COLUMNS:
            columns[name] = pc.coalesce(from_resource, from_spans)
        else:
            columns[name] = pc.coalesce(from_spans, from_resource)
    event_errors = {int(before[i]): error for i, error in batch.event_errors.items() if valid[i]}
    if event_errors:
        events = [event_errors.get(i) for i in range(n)]
        columns["error_type"] = pc.coalesce(columns["error_type"], pa.array(events, pa.string()))
    names = columns["name"]
    columns["is_engine"] = pc.or_(
        pc.or_(pc.is_in(names, _ENGINE_NAMES), pc.match_substring(names, " Req ")),
        pc.or_(pc.starts_with(names, "Req "), pc.or_(pc.is_valid(columns["ttft_s"]), pc.is_valid(columns["e2e_s"]))),
    )
    # SGLang reports TTFT (from arrival) and prefill (from scheduling) but no queue time: the
    # difference is the time before the model worked on the request. A clearly negative
    # difference is malformed data, not a queue.
    before_model = pc.subtract(columns["ttft_s"], columns["prefill_s"])
    derived_queue = pc.if_else(
        pc.greater_equal(before_model, _QUEUE_TOLERANCE_S), pc.max_element_wise(before_model, _ZERO_S), _NULL_FLOAT
    )
    columns["queue_s"] = pc.coalesce(columns["queue_s"], derived_queue)
    tokens = columns["output_tokens"]
    # safe=False: a token count beyond 2**53 (malformed, but decodable) rounds instead of failing the batch.
    per_token = pc.divide(columns["decode_s"], pc.cast(pc.subtract(tokens, _ONE), pa.float64(), safe=False))
    columns["tpot_s"] = pc.if_else(pc.greater(tokens, _ONE), per_token, _NULL_FLOAT)
    elapsed = pc.subtract(columns["end_ns"], columns["start_ns"])
    columns["duration_s"] = pc.divide(pc.cast(elapsed, pa.float64(), safe=False), _NS_PER_S)
    resource_maps = [(int(before[first]), keys, values) for first, keys, values in batch.resource_maps]
    repeated = _repeated(span_of_attr, attrs, n)
    schema = spans_arrow_schema()
    if not stored:
        columns["attributes"] = _attribute_map(offsets, attrs, ~repeated)
        columns["resource_attributes"] = _resource_map(resource_maps, n)
        return pa.Table.from_arrays([_as_type(columns[f.name], f.type) for f in schema], schema=schema)
    typed = {f.name: _as_type(columns[f.name], f.type) for f in schema if f.name in columns}
    promoted, promoted_resource = np.zeros(n, np.int64), np.zeros(n, np.int64)
    dropped = reproduced_entries(attrs, span_of_attr, ~repeated, typed, promoted)
    extra_resource = split_promoted(_resource_map(resource_maps, n), typed, promoted_resource)
    rows = {name: typed[name] for name in schema.names if name not in ("attributes", "resource_attributes")}
    rows["extra_resource_attributes"] = extra_resource
    keep = ~(repeated | dropped)
    attrs.spell(keep)
    rows["extra_attributes"] = _attribute_map(offsets, attrs, keep)
    rows["promoted"] = pa.array(promoted, pa.int64())
    rows["promoted_resource"] = pa.array(promoted_resource, pa.int64())
    return pa.Table.from_pydict(rows)


def _kept(values: np.ndarray, kept: np.ndarray, everything: bool) -> np.ndarray:
    return values if everything else values[kept]


def _strings(values: list[str], mask: pa.Array | None) -> pa.Array:
    array = pa.array(values, pa.string())
    return array if mask is None else array.filter(mask)


# _HEX_PAIRS[b] holds the two ASCII hex digits of byte b in memory order, so that
# gathering it over an id's bytes spells the id as bytes.hex() does.
_HEX_PAIRS = np.frombuffer(b"".join(f"{b:02x}".encode() for b in range(256)), np.uint16)


def _hex(values: list[bytes], mask: pa.Array | None) -> pa.Array:
    """Lowercase hex of each id, as bytes.hex() spells it, for the whole batch at once (an empty id gives "")."""
    ids = pa.array(values, pa.binary())
    if mask is not None:
        ids = ids.filter(mask)
    buffers = ids.buffers()
    offsets = np.frombuffer(buffers[1], np.int32, count=len(ids) + 1)
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    digits = _HEX_PAIRS[data[offsets[0] : offsets[-1]]]
    doubled = ((offsets - offsets[0]) * 2).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(ids), [None, pa.py_buffer(doubled), pa.py_buffer(digits)])


def _repeat(groups: list[tuple[int, Any]], n: int, arrow_type: pa.DataType) -> pa.Array:
    """One value per span from ``(first span, value)`` runs that each last until the next run starts."""
    if not groups:
        return pa.nulls(n, arrow_type)
    values = pa.array([value for _, value in groups], arrow_type)
    firsts = np.array([first for first, _ in groups], np.int64)
    sizes = np.diff(np.append(firsts, n))
    return values.take(pa.array(np.repeat(np.arange(len(groups)), sizes)))


def _as_type(values: Any, arrow_type: pa.DataType) -> pa.Array:
    if isinstance(values, pa.Array):
        return values if values.type == arrow_type else values.cast(arrow_type)
    return pa.array(values, type=arrow_type)


def _repeated(span_of_attr: np.ndarray, attrs: Attributes, n: int) -> np.ndarray:
    """Per attribute, whether an earlier attribute of its span has the same key (the map keeps the first).

    OTLP requires unique keys but does not enforce them, and DuckDB refuses a
    MAP with a repeated key, which would fail the whole commit.
    """
    width = max(1, len(attrs.key_names))
    pair = span_of_attr * width + attrs.key_ids
    repeated = np.zeros(len(pair), bool)
    if _has_repeats(pair, n * width):
        order = np.argsort(pair, kind="stable")
        repeated[order[1:]] = pair[order[1:]] == pair[order[:-1]]
    return repeated


def _attribute_map(offsets: np.ndarray, attrs: Attributes, keep: np.ndarray) -> pa.Array:
    """The span attributes as a MAP, without the entries ``keep`` leaves out."""
    keys, values = attrs.keys, attrs.values
    if not keep.all():
        kept = np.concatenate([[0], np.cumsum(keep)])
        offsets = kept[offsets]
        mask = pa.array(keep)
        keys, values = keys.filter(mask), values.filter(mask)
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, values)


def _has_repeats(values: np.ndarray, bound: int) -> bool:
    """Whether non-negative ``values`` (all below ``bound``) hold a repeat."""
    if len(values) < 2:
        return False
    if bound <= 16 * len(values):  # dense: counting is ~50x cheaper than sorting
        return bool(np.bincount(values, minlength=bound).max() > 1)
    ordered = np.sort(values)
    return bool((ordered[1:] == ordered[:-1]).any())


def _resource_map(groups: list[tuple[int, list[str], list[str]]], n: int) -> pa.Array:
    """Every span carries its resource's attributes: repeat each resource's map over its spans.

    Each resource's entries are converted to Arrow once and gathered per span
    by index (converting the repeated Python strings cost ~0.3 us a span).
    """
    if not groups:
        return pa.MapArray.from_arrays(
            pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()), pa.array([], pa.string())
        )
    firsts = np.array([first for first, _, _ in groups], np.int64)
    spans_of_group = np.diff(np.append(firsts, n))
    group_sizes = np.array([len(keys) for _, keys, _ in groups], np.int64)
    group_starts = np.concatenate([[0], np.cumsum(group_sizes)[:-1]])
    sizes = np.repeat(group_sizes, spans_of_group)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    total = int(offsets[-1])
    # entry j of span i reads entry j of its resource: resource start + (j's place within the span)
    within = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], sizes)
    entries = pa.array(np.repeat(np.repeat(group_starts, spans_of_group), sizes) + within)
    keys = pa.array([key for _, group_keys, _ in groups for key in group_keys], pa.string()).take(entries)
    values = pa.array([value for _, _, group_values in groups for value in group_values], pa.string()).take(entries)
    return pa.MapArray.from_arrays(pa.array(offsets.astype(np.int32)), keys, values)


def _choose(
    sources: tuple[str, ...], attrs: Attributes, key_index: dict[str, int], span_of_attr: np.ndarray, n: int
) -> np.ndarray:
    """Per span, the index of the attribute that feeds the column (-1 = none).

    Keys are written from the lowest priority to the highest, so the best
    present key wins; within one key the first occurrence wins.
    """
    chosen = np.full(n, -1, np.int64)
    for key in reversed(sources):
        key_id = key_index.get(key)
        if key_id is None:
            continue
        where = np.flatnonzero(attrs.key_ids == key_id)[::-1]
        chosen[span_of_attr[where]] = where
    return chosen


def _typed(name: str, chosen: np.ndarray, attrs: Attributes) -> pa.Array:
    """The canonical column from the chosen attributes; values that do not fit become NULL."""
    present = chosen >= 0
    arrow_type = _ARROW_TYPES[name]
    if not present.any():
        return pa.nulls(chosen.size, type=arrow_type)
    safe = np.where(present, chosen, 0)
    if name in INT_COLUMNS or name in FLOAT_COLUMNS:
        numeric = name in FLOAT_COLUMNS
        out = (attrs.numbers if numeric else attrs.integers)[safe]
        kinds = attrs.kinds[safe]
        is_number = (kinds == KIND_DOUBLE) | (kinds == KIND_INT)
        ok = present & (is_number if numeric else attrs.integer_ok[safe])
        if arrow_type == pa.int32():
            ok &= (out > -INT32_BOUND) & (out < INT32_BOUND)
        # Numbers sent as strings (or other odd types) are parsed one by one.
        for span in np.flatnonzero(present & ~ok & ~is_number).tolist():
            index = int(chosen[span])
            raw = attrs.slow_values.get(index, attrs.values[index].as_py())
            parsed = _as_float(raw) if numeric else _as_int(raw)
            if parsed is not None:
                out[span] = parsed
                ok[span] = True
        return pa.array(out, type=arrow_type, mask=~ok)
    texts = attrs.values.take(pa.array(chosen, mask=~present))
    if name == "finish_reason":
        return pa.array(_finish_reasons(texts.to_pylist()), pa.string())
    return texts


def _finish_reasons(texts: list[str | None]) -> list[str | None]:
    cache: dict[str, str | None] = {}
    out: list[str | None] = []
    for text in texts:
        if text is None:
            out.append(None)
            continue
        reason = cache.get(text, "\0")
        if reason == "\0":
            reason = cache[text] = first_finish_reason(text)
        out.append(reason)
    return out


def _resource_column(name: str, slot: int, resource_slots: list[tuple[int, list[Any]]], n: int) -> pa.Array | None:
    """Per-span values a column takes from the resource, or None when no resource has it."""
    if all(values[slot] is None for _, values in resource_slots):
        return None
    out: list[Any] = []
    bounds = [first for first, _ in resource_slots[1:]] + [n]
    for (first, values), end in zip(resource_slots, bounds, strict=True):
        out.extend([_coerce(name, values[slot])] * (end - first))
    return pa.array(out, type=_ARROW_TYPES[name])


def _coerce(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in INT_COLUMNS:
        number = _as_int(value)
        # As _typed does for span values: a resource value beyond int32 once failed the whole batch.
        if number is not None and _ARROW_TYPES[name] == pa.int32() and not -INT32_BOUND < number < INT32_BOUND:
            return None
        return number
    if name in FLOAT_COLUMNS:
        return _as_float(value)
    if name == "finish_reason":
        return first_finish_reason(value)
    return _as_str(value)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = int(value) if isinstance(value, int) else int(float(value))
    except (TypeError, ValueError, OverflowError):
        return None
    return number if -(1 << 63) <= number < (1 << 63) else None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _as_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return _as_str(value[0]) if value else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
