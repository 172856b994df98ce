"""Canonical spans -> stored ``span_rows``: each promoted attribute kept once (issue 18).

A decoded batch (:func:`sre_agent.store.schema.spans_arrow_schema`) carries every
attribute in its two maps, including the dozen an engine span also has in
canonical columns. DuckDB validates every MAP entry it appends, so those
duplicates were most of the store's append cost. :func:`to_span_rows`
leaves an entry of :data:`~sre_agent.store.schema.PROMOTED_KEYS` out of the stored
map when the ``spans`` view will spell it back exactly, i.e. when its value
equals the view's spelling of its span's column
(:func:`sre_agent.store.schema.promoted_sql`), and sets the entry's bit in
``promoted`` (``promoted_resource`` for the resource map). :func:`reproduced_entries` makes the same
decision from decoded attribute values, for the receivers' build
(:func:`sre_agent.ingest.otlp.build_spans` with ``stored``), without spelling numbers.

What "exactly" rests on: strings compare as they are; integers are spelled
the same by Arrow and DuckDB; doubles only where Arrow's shortest round-trip
spelling is the view's too, which holds for non-integral values with
``1e-4 <= |x| < 1e9`` (DuckDB's own spelling) and for integral values with
``|x| < 1e9`` except ``-0`` (which the view spells as the integer, as Arrow
does: ``1.0`` is ``1``; :func:`sre_agent.store.schema.promoted_sql`). A test checks
both on millions of values, so a DuckDB or Arrow that spells them
differently fails there. Other doubles (``3e-05``, ``-0``, ``2e9``) stay in
the map: cheaper to keep than to risk a respelling. Integral doubles matter:
vLLM's default ``temperature`` and ``top_p`` are ``1.0``, greedy sampling's ``0.0``.
Whatever this module does, a reader of ``spans`` sees the received strings.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sre_agent.ingest.attrs import KIND_DOUBLE, KIND_INT, Attributes
from sre_agent.store.schema import PROMOTED_KEYS

__all__ = ["reproduced_entries", "safe_doubles", "split_promoted", "to_span_rows"]

_KEYS: Final = pa.array([key for key, _ in PROMOTED_KEYS], pa.string())
_COLUMN_OF: Final = [column for _, column in PROMOTED_KEYS]
#: Doubles whose Arrow and DuckDB spellings agree (see the module docstring).
_SAFE_DOUBLE_MIN, _SAFE_DOUBLE_MAX = 1e-4, 1e9


def safe_doubles(numbers: np.ndarray) -> np.ndarray:
    """Which ``numbers`` Arrow and the view spell alike (see the module docstring; NaN: no)."""
    with np.errstate(invalid="ignore"):
        magnitude = np.abs(numbers)
        integral = numbers == np.trunc(numbers)
        fraction_ok = ~integral & (magnitude >= _SAFE_DOUBLE_MIN)
        integral_ok = integral & ~((numbers == 0) & np.signbit(numbers))
        safe: np.ndarray = (magnitude < _SAFE_DOUBLE_MAX) & (fraction_ok | integral_ok)
    return safe


def _reproduced(items: pa.Array, entries: np.ndarray, column: pa.Array, spans: np.ndarray) -> np.ndarray:
    """Which ``items[entries]`` equal DuckDB's VARCHAR spelling of ``column[spans]`` (bool per entry).

    Only the rows that hold the key are spelled, and doubles only where Arrow spells them as
    DuckDB does (formatting a double is the costly part: ~6 a span).
    """
    values = column.take(pa.array(spans))
    hit = np.zeros(entries.size, bool)
    if pa.types.is_string(values.type):
        chosen = np.arange(entries.size)
    elif pa.types.is_floating(values.type):
        chosen = np.flatnonzero(safe_doubles(values.to_numpy(zero_copy_only=False)))
        values = pc.cast(values.take(pa.array(chosen)), pa.string())
    elif pa.types.is_integer(values.type):
        chosen = np.arange(entries.size)
        values = pc.cast(values, pa.string())
    else:
        return hit
    if chosen.size:
        same = pc.equal(items.take(pa.array(entries[chosen])), values)
        hit[chosen] = pc.fill_null(same, False).to_numpy(zero_copy_only=False)
    return hit


def split_promoted(attributes: pa.Array, columns: dict[str, pa.Array], promoted: np.ndarray) -> pa.MapArray:
    """``attributes`` without the entries their columns reproduce; sets their bits in ``promoted``."""
    if isinstance(attributes, pa.ChunkedArray):
        attributes = attributes.combine_chunks()
    assert isinstance(attributes, pa.MapArray)
    # .keys/.items are this (possibly sliced) array's entries; .offsets still count from the child's start.
    offsets = np.asarray(attributes.offsets, np.int64)
    offsets -= offsets[0]
    keys, items = attributes.keys, attributes.items
    which = pc.fill_null(pc.index_in(keys, value_set=_KEYS), -1).to_numpy(zero_copy_only=False)
    candidates = np.flatnonzero(which >= 0)
    if candidates.size == 0:
        return attributes
    key_of = which[candidates].astype(np.int64)
    span_of = np.searchsorted(offsets, candidates, side="right") - 1
    drop = np.zeros(len(keys), bool)
    for key in np.flatnonzero(np.bincount(key_of, minlength=len(_COLUMN_OF))).tolist():
        chosen = key_of == key
        entries, spans = candidates[chosen], span_of[chosen]
        hit = _reproduced(items, entries, columns[_COLUMN_OF[key]], spans)
        drop[entries[hit]] = True
        # Keys are unique within one map (the decoder keeps a repeated key's first value), so
        # each (span, bit) is set once and plain fancy-index assignment is exact.
        promoted[spans[hit]] |= np.int64(1) << np.int64(key)
    if not drop.any():
        return attributes
    keep = ~drop
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    new_offsets = pa.array(kept_before[offsets], pa.int32())
    mask = pa.array(keep)
    return pa.MapArray.from_arrays(new_offsets, keys.filter(mask), items.filter(mask))


def reproduced_entries(
    attrs: Attributes, span_of_attr: np.ndarray, kept: np.ndarray, columns: dict[str, pa.Array], promoted: np.ndarray
) -> np.ndarray:
    """Which span attributes their span's column spells back exactly (bool per attribute); sets their bits.

    The same rule as :func:`to_span_rows`, decided from the decoded
    values instead of spelling the column: a string equals the column; an integer sent as
    an integer equals it; a double sent as a double equals it and lies where Arrow and
    DuckDB spell doubles alike. Anything else (numbers sent as strings, integral doubles)
    stays in the map, which is always correct, only less compact.
    """
    dropped = np.zeros(len(attrs.key_ids), bool)
    index = {name: i for i, name in enumerate(attrs.key_names)}
    for bit, (key, column_name) in enumerate(PROMOTED_KEYS):
        key_id = index.get(key)
        if key_id is None:
            continue
        entries = np.flatnonzero((attrs.key_ids == key_id) & kept)
        if entries.size == 0:
            continue
        spans = span_of_attr[entries]
        # Repeats are not kept, so a key on every span has spans == arange(n): no gather needed.
        whole = spans.size == len(promoted)
        column = columns[column_name] if whole else columns[column_name].take(pa.array(spans))
        if pa.types.is_string(column.type):
            candidate, decoded = np.ones(entries.size, bool), attrs.values.take(pa.array(entries))
        elif pa.types.is_integer(column.type):
            column = pc.cast(column, pa.int64())
            candidate, decoded = attrs.kinds[entries] == KIND_INT, pa.array(attrs.integers[entries])
        else:
            numbers = attrs.numbers[entries]
            candidate, decoded = (attrs.kinds[entries] == KIND_DOUBLE) & safe_doubles(numbers), pa.array(numbers)
        same = pc.fill_null(pc.equal(column, decoded), False).to_numpy(zero_copy_only=False)
        hit = candidate & np.asarray(same, bool)
        dropped[entries[hit]] = True
        promoted[spans[hit]] |= np.int64(1) << np.int64(bit)
    return dropped


def to_span_rows(table: pa.Table) -> pa.Table:
    """The ``span_rows`` form of canonical spans (same rows, same order).

    Columns: every canonical column, then ``extra_resource_attributes``,
    ``extra_attributes``, ``promoted`` and ``promoted_resource`` (BIGINT bit
    sets, see :data:`~sre_agent.store.schema.PROMOTED_KEYS`).
    """
    n = table.num_rows
    columns = {name: table.column(name).combine_chunks() for name in set(_COLUMN_OF)}
    promoted, promoted_resource = np.zeros(n, np.int64), np.zeros(n, np.int64)
    extra_resource = split_promoted(table.column("resource_attributes"), columns, promoted_resource)
    extra = split_promoted(table.column("attributes"), columns, promoted)
    rows = table.drop_columns(["resource_attributes", "attributes"])
    return (
        rows.append_column("extra_resource_attributes", extra_resource)
        .append_column("extra_attributes", extra)
        .append_column("promoted", pa.array(promoted, pa.int64()))
        .append_column("promoted_resource", pa.array(promoted_resource, pa.int64()))
    )
