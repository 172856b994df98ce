"""Vectorised decoding of serialized span attributes (OTLP ``KeyValue`` messages).

Why: with upb, reading one attribute through the message API costs about a
microsecond of Python, and an engine span carries ~20 of them, so attribute
flattening was nearly all of the ingest cost. Spans are therefore parsed
with their attributes left as raw bytes (see :mod:`sre_agent.ingest.otlp`), and
this module decodes all attributes of a batch at once with numpy and Arrow:

* the common layout ``0x0A klen key 0x12 vlen tag payload`` with a double,
  int, bool or short string payload is decoded by array operations (keys and
  strings are cut out of the batch buffer by one Arrow ``take`` and
  validated as UTF-8 when cast to strings);
* anything else (arrays, key-value lists, bytes, long strings, NaN or
  infinite doubles, unusual field order) is parsed one by one with the real
  ``KeyValue`` parser and :meth:`Normaliser.entry`.

Both paths produce the same strings, so a row does not depend on the path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1 import common_pb2

from sre_agent.errors import BadPayloadError
from sre_agent.ingest.normalise import Normaliser, any_value_to_python

__all__ = ["KIND_BOOL", "KIND_DOUBLE", "KIND_INT", "KIND_SLOW", "KIND_STRING", "Attributes", "decode_attributes"]

KIND_SLOW, KIND_DOUBLE, KIND_INT, KIND_STRING, KIND_BOOL = 0, 1, 2, 3, 4


@dataclass
class Attributes:
    """``m`` decoded attributes, in input order.

    Attributes:
        keys: attribute keys.
        values: values as stored in the MAP column (stringified, redacted).
        key_ids: index of each key in ``key_names``.
        key_names: the distinct keys.
        kinds: ``KIND_*`` of each value.
        numbers: the value as float for double and int kinds, else NaN.
        integers: the value for int kinds, the truncated value for finite
            doubles, else 0 (see ``integer_ok``).
        integer_ok: where ``integers`` holds a value.
        slow_values: typed value of each slow-path attribute, by index.
        unspelled: indexes of doubles whose ``values`` entry is NULL until
            :meth:`spell` (see ``deferred_keys`` of :func:`decode_attributes`).
    """

    keys: pa.Array
    values: pa.Array
    key_ids: np.ndarray
    key_names: list[str]
    kinds: np.ndarray
    numbers: np.ndarray
    integers: np.ndarray
    integer_ok: np.ndarray
    slow_values: dict[int, Any]
    unspelled: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    def spell(self, needed: np.ndarray) -> None:
        """Spell the unspelled doubles that ``needed`` (bool per attribute) marks into ``values``."""
        chosen = self.unspelled[needed[self.unspelled]]
        if chosen.size == 0:
            return
        mask = np.zeros(len(self.values), bool)
        mask[chosen] = True
        self.values = pc.replace_with_mask(self.values, pa.array(mask), format_doubles(self.numbers[chosen]))
        self.unspelled = self.unspelled[~needed[self.unspelled]]


def _empty() -> Attributes:
    nothing = pa.array([], type=pa.string())
    return Attributes(
        nothing,
        nothing,
        np.zeros(0, np.int64),
        [],
        np.zeros(0, np.uint8),
        np.zeros(0, np.float64),
        np.zeros(0, np.int64),
        np.zeros(0, bool),
        {},
    )


def slow_entry(data: bytes, norm: Normaliser) -> tuple[str, str, Any]:
    """``(key, map string, typed value)`` of one attribute through the real parser."""
    try:
        kv = common_pb2.KeyValue.FromString(data)
    except DecodeError as exc:
        raise BadPayloadError(f"malformed span attribute: {exc}") from exc
    key, text, typed, _column, _prio = norm.entry(kv.key, any_value_to_python(kv.value))
    return key, text, typed


# Typed, so that Arrow does not infer (and try a failing import) on every call.
_TRUE = pa.scalar("true", pa.string())
_FALSE = pa.scalar("false", pa.string())

_PAD = 256  # > longest fast-path reach past an attribute's start (key < 128 bytes + 5 + 12)


class _Buffer:
    """The concatenated attribute bytes, padded so that gathers never run off the end."""

    def __init__(self, binary: pa.Array) -> None:
        buffers = binary.buffers()
        self.arrow = buffers[2] if buffers[2] is not None else pa.py_buffer(b"\0")
        self.data = np.concatenate([np.frombuffer(self.arrow, dtype=np.uint8), np.zeros(_PAD, np.uint8)])
        offsets = np.frombuffer(buffers[1], dtype=np.int32, count=len(binary) + 1)
        self.starts = offsets[:-1].astype(np.int64)
        self.ends = offsets[1:].astype(np.int64)

    def byte(self, index: np.ndarray) -> np.ndarray:
        """``data[index]``; indexes past an attribute read the next one or the padding (callers mask those)."""
        gathered: np.ndarray = self.data[index]
        return gathered

    def raw_slices(self, offsets: np.ndarray, lengths: np.ndarray) -> pa.Array:
        """Bytes at (offset, length) of the buffer, as an Arrow binary array.

        The slices are in buffer order and do not overlap, so one binary array
        over the whole buffer can alternate them with the gaps between them
        (element 2i is slice i, element 2i + 1 the bytes up to slice i + 1);
        taking the even elements copies the slices in C++. About ten times
        cheaper than assembling binary_view structs with numpy gathers.
        """
        count = offsets.size
        bounds = np.empty(2 * count + 1, np.int32)
        bounds[0:-1:2] = offsets
        bounds[1::2] = offsets + lengths
        bounds[-1] = bounds[-2] if count else 0
        pairs = pa.Array.from_buffers(pa.binary(), 2 * count, [None, pa.py_buffer(bounds), self.arrow])
        return pairs.take(pa.array(np.arange(0, 2 * count, 2)))

    def views(self, offsets: np.ndarray, lengths: np.ndarray) -> pa.Array:
        """Strings at (offset, length) of the buffer, as a validated Arrow string array."""
        try:
            return self.raw_slices(offsets, lengths).cast(pa.string())
        except pa.ArrowInvalid as exc:
            raise BadPayloadError(f"span attribute is not valid UTF-8: {exc}") from exc


def decode_attributes(flat: pa.Array, norm: Normaliser, deferred_keys: frozenset[str] = frozenset()) -> Attributes:
    """Decode serialized ``KeyValue`` messages (all attributes of a batch, a binary array without nulls).

    Doubles under ``deferred_keys`` are left unspelled (NULL in ``values``,
    listed in ``unspelled``): a caller that drops most of them (the stored
    form keeps a latency once, in its column) spells only the rest, with
    :meth:`Attributes.spell`. Formatting doubles is the costliest step here.
    """
    m = len(flat)
    if m == 0:
        return _empty()
    buf = _Buffer(flat)
    starts, ends = buf.starts, buf.ends
    ok = (ends - starts >= 5) & (buf.byte(starts) == 0x0A) & (buf.byte(starts + 1) < 0x80)
    key_len = buf.byte(starts + 1).astype(np.int64)
    value_at = starts + key_len + 5  # after the key, 0x12, the value length and the AnyValue tag
    value_len = buf.byte(value_at - 2).astype(np.int64)
    ok &= (value_at <= ends) & (buf.byte(value_at - 3) == 0x12) & (value_len < 0x80)
    ok &= value_len == ends - value_at + 1
    tag = buf.byte(value_at - 1)
    payload = ends - value_at
    first = buf.byte(value_at).astype(np.int64)

    kinds = np.zeros(m, np.uint8)
    kinds[ok & (tag == 0x10) & (payload == 1) & (first <= 1)] = KIND_BOOL
    string_ok = ok & (tag == 0x0A) & (payload >= 1) & (first < 0x80) & (first == payload - 1)
    if not norm.keep_content:
        string_ok &= first <= norm.max_attribute_bytes
    kinds[string_ok] = KIND_STRING

    numbers = np.full(m, np.nan)
    integers = np.zeros(m, np.int64)
    integer_ok = np.zeros(m, bool)
    double_at = np.flatnonzero(ok & (tag == 0x21) & (payload == 8))
    if double_at.size:
        # Arrow copies the 8-byte slices into one contiguous buffer (cheaper than a numpy 2-D gather).
        sliced = buf.raw_slices(value_at[double_at], np.full(double_at.size, 8, np.int64))
        doubles = np.frombuffer(sliced.buffers()[2], "<f8", count=double_at.size).copy()
        finite = np.isfinite(doubles)  # NaN/inf: the slow path spells them as in OTLP JSON
        double_at, doubles = double_at[finite], doubles[finite]
        kinds[double_at] = KIND_DOUBLE
        numbers[double_at] = doubles
        in_range = np.abs(doubles) < 9.2e18
        integers[double_at[in_range]] = doubles[in_range].astype(np.int64)
        integer_ok[double_at[in_range]] = True
    int_at = np.flatnonzero(ok & (tag == 0x18) & (payload >= 1) & (payload <= 10))
    if int_at.size:
        values, valid = _varints(buf, value_at[int_at], payload[int_at])
        int_at, values = int_at[valid], values[valid]
        kinds[int_at] = KIND_INT
        integers[int_at] = values
        integer_ok[int_at] = True
        numbers[int_at] = values.astype(np.float64)

    fast = kinds != KIND_SLOW
    fast_at = np.flatnonzero(fast)
    slow_at = np.flatnonzero(~fast)
    slow = [slow_entry(flat[i].as_py(), norm) for i in slow_at.tolist()]
    key_names, fast_ids = _distinct_keys(buf, starts[fast_at] + 2, key_len[fast_at])
    key_ids = np.empty(m, np.int64)
    key_ids[fast_at] = fast_ids
    index = {name: i for i, name in enumerate(key_names)}
    for position, entry in zip(slow_at.tolist(), slow, strict=True):
        key_ids[position] = index.setdefault(entry[0], len(index))
    key_names = list(index)
    keys = pa.array(key_names, pa.string()).take(pa.array(key_ids))

    strings_at = np.flatnonzero(kinds == KIND_STRING)
    doubles_at = np.flatnonzero(kinds == KIND_DOUBLE)
    deferred = [key_id for name, key_id in index.items() if name in deferred_keys]
    unspelled = doubles_at[np.isin(key_ids[doubles_at], deferred)] if deferred else np.zeros(0, np.int64)
    spelled = doubles_at if unspelled.size == 0 else np.setdiff1d(doubles_at, unspelled, assume_unique=True)
    ints_at = np.flatnonzero(kinds == KIND_INT)
    bools_at = np.flatnonzero(kinds == KIND_BOOL)
    value_pieces = [
        buf.views(value_at[strings_at] + 1, first[strings_at]),
        format_doubles(numbers[spelled]),
        pc.cast(pa.array(integers[ints_at]), pa.string()),
        pc.if_else(pa.array(first[bools_at] == 1), _TRUE, _FALSE),
        pa.array([s[1] for s in slow], pa.string()),
        pa.nulls(unspelled.size, pa.string()),
    ]
    groups = [strings_at, spelled, ints_at, bools_at, slow_at, unspelled]
    values = pa.concat_arrays(value_pieces).take(_positions(m, groups))

    values = _redact_content(values, key_ids, key_names, fast, norm)
    slow_values = {int(i): s[2] for i, s in zip(slow_at.tolist(), slow, strict=True)}
    return Attributes(keys, values, key_ids, key_names, kinds, numbers, integers, integer_ok, slow_values, unspelled)


def _distinct_keys(buf: _Buffer, offsets: np.ndarray, lengths: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct keys among fast-path attributes and each attribute's index into them.

    Keys repeat on every span, so they are hashed by Arrow as binary slices
    of the request buffer (faster than hashing fixed-width padded rows) and
    only the distinct ones are decoded in Python.
    """
    if offsets.size == 0:
        return [], np.zeros(0, np.int64)
    encoded = buf.raw_slices(offsets, lengths).dictionary_encode()
    try:
        names = [key.decode("utf-8") for key in encoded.dictionary.to_pylist()]
    except UnicodeDecodeError as exc:
        raise BadPayloadError(f"span attribute key is not valid UTF-8: {exc}") from exc
    return names, np.asarray(encoded.indices, dtype=np.int64)


def format_doubles(values: np.ndarray) -> pa.Array:
    """The MAP spelling of finite doubles (Arrow's shortest round-trip form, e.g. ``0.25``, ``2``)."""
    return pc.cast(pa.array(values, type=pa.float64()), pa.string())


def _varints(buf: _Buffer, at: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode protobuf varints of known byte lengths; returns (int64 values, well-formed mask)."""
    result = np.zeros(at.size, np.uint64)
    valid = np.ones(at.size, bool)
    for j in range(int(lengths.max())):
        inside = lengths > j
        byte = buf.byte(at + j).astype(np.uint64)
        last = lengths == j + 1
        # every byte but the last has the continuation bit; the last does not
        valid &= ~inside | np.where(last, byte < 0x80, byte >= 0x80)
        result |= np.where(inside, (byte & np.uint64(0x7F)) << np.uint64(7 * j), np.uint64(0))
    return result.view(np.int64), valid


def _positions(m: int, groups: list[np.ndarray]) -> pa.Array:
    """Take-indexes that put concatenated groups back in input order."""
    positions = np.empty(m, np.int64)
    base = 0
    for group in groups:
        positions[group] = np.arange(base, base + group.size)
        base += group.size
    return pa.array(positions)


def _redact_content(
    values: pa.Array, key_ids: np.ndarray, key_names: list[str], fast: np.ndarray, norm: Normaliser
) -> pa.Array:
    """Replace fast-path values of content attributes by their redacted form.

    Slow-path values were redacted by :meth:`Normaliser.entry` already; long
    strings never take the fast path unless ``keep_content``.
    """
    content = [i for i, name in enumerate(key_names) if norm.is_content(name)]
    if not content:
        return values
    mask = np.isin(key_ids, content) & fast
    if not mask.any():
        return values
    texts = values.filter(pa.array(mask)).to_pylist()
    return pc.replace_with_mask(values, pa.array(mask), pa.array([norm.redact(t) for t in texts], pa.string()))
