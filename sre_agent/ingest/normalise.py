"""Attribute normalisation and privacy redaction.

The :class:`Normaliser` holds everything that turns an OTLP attribute into
what the store keeps:

* the **stringified value** kept in the ``attributes`` / ``resource_attributes``
  ``MAP(VARCHAR, VARCHAR)`` columns (strings as is, numbers in their shortest
  round-trip form, booleans as ``true``/``false``, arrays and key-value lists
  as JSON, bytes as base64);
* the **typed value** that may fill a canonical column
  (:data:`sre_agent.store.schema.SPAN_ATTRIBUTE_SOURCES`);
* **privacy**: every attribute in :data:`sre_agent.store.schema.CONTENT_ATTRIBUTES`,
  and every value longer than ``max_attribute_bytes`` (UTF-8 bytes), is
  replaced by ``redacted:len=<bytes>:hmac=<16 hex digits>`` where the digest
  is HMAC-SHA256 keyed by the store's hash key. Equal values still compare
  equal (same hash), but the content cannot be read back. ``keep_content``
  keeps both verbatim.

Decoding loops in :mod:`sre_agent.ingest.otlp` call into this module; this module
does no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from collections.abc import Iterable
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from sre_agent.store.schema import (
    CONTENT_ATTRIBUTES,
    RESOURCE_FIRST_COLUMNS,
    SPAN_ATTRIBUTE_SOURCES,
    SPAN_COLUMNS,
)

__all__ = [
    "CANONICAL_COLUMNS",
    "FLOAT_COLUMNS",
    "INT_COLUMNS",
    "Normaliser",
    "any_value_to_python",
    "first_finish_reason",
    "stringify",
]

# Canonical columns filled from attributes, in a fixed order: the slot
# index of a column in the per-span value list built by the decoder.
CANONICAL_COLUMNS: Final[tuple[str, ...]] = tuple(SPAN_ATTRIBUTE_SOURCES)
# Which of them are numbers, read off their declared DuckDB type (one place to add a column).
_SQL_TYPE = {c.name: c.duckdb.split()[0] for c in SPAN_COLUMNS}
INT_COLUMNS: Final[frozenset[str]] = frozenset(c for c in CANONICAL_COLUMNS if _SQL_TYPE[c] in ("BIGINT", "INTEGER"))
FLOAT_COLUMNS: Final[frozenset[str]] = frozenset(c for c in CANONICAL_COLUMNS if _SQL_TYPE[c] == "DOUBLE")

# Priority offsets: a lower number wins. Span attributes beat resource
# attributes except for RESOURCE_FIRST_COLUMNS, where the resource wins.
_SPAN_BASE = 100
_RESOURCE_BASE = 200
_RESOURCE_FIRST_BASE = 0
NO_PRIORITY: Final[int] = 1_000_000


def stringify(value: Any) -> str:
    """The string form of a decoded attribute value kept in the MAP columns.

    Args:
        value: ``str``, ``bool``, ``int``, ``float``, ``bytes``, a list or a
            dict as produced by :func:`any_value_to_python`; ``None`` (an
            empty ``AnyValue``) becomes ``""``.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if value is None:
        return ""
    return json.dumps(_jsonable(value), ensure_ascii=False, separators=(",", ":"))


def _float_str(value: float) -> str:
    if math.isfinite(value):
        # Arrow's shortest round-trip spelling, as the vectorised decoder writes doubles.
        text: str = pc.cast(pa.array([value], pa.float64()), pa.string())[0].as_py()
        return text
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return _float_str(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def any_value_to_python(value: Any) -> Any:
    """Convert an OTLP ``AnyValue`` message into a plain Python value.

    Returns ``str``/``bool``/``int``/``float``/``bytes``, a list for
    ``array_value``, a dict for ``kvlist_value`` and ``None`` when no field
    of the oneof is set.
    """
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value_to_python(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value_to_python(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which)


def first_finish_reason(value: Any) -> str | None:
    """The first finish reason from a string array or a JSON-encoded string.

    SGLang (and unreleased vLLM code) send ``'["stop"]'`` as a string; the
    GenAI semantic conventions send a string array. A plain string that is
    not a JSON array is taken as the reason itself. ``None`` when empty.
    """
    if isinstance(value, list):
        return str(value[0]) if value else None
    if not isinstance(value, str):
        return None if value is None else str(value)
    text = value.strip()
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except ValueError:
            return text or None
        if isinstance(parsed, list):
            return str(parsed[0]) if parsed else None
    return text or None


class Normaliser:
    """Maps OTLP attributes onto canonical columns and applies privacy.

    Args:
        keep_content: keep content attributes and over-long values verbatim
            (``--keep-content``); by default they are redacted.
        max_attribute_bytes: values longer than this many UTF-8 bytes are
            redacted (unless ``keep_content``).
        hash_key: the HMAC key for redacted values; the store keeps a random
            one per database (:attr:`sre_agent.store.embedded.Store.hash_key`) so
            hashes are comparable within a store but not across stores.

    A Normaliser holds no mutable state and is safe to share between threads.
    """

    def __init__(self, keep_content: bool = False, max_attribute_bytes: int = 4096, *, hash_key: bytes) -> None:
        if max_attribute_bytes < 1:
            raise ValueError("max_attribute_bytes must be positive")
        self.keep_content = keep_content
        self.max_attribute_bytes = max_attribute_bytes
        self.hash_key = bytes(hash_key)
        index = {name: i for i, name in enumerate(CANONICAL_COLUMNS)}
        # attribute key -> (slot, priority when on the span, priority when on the resource)
        self.key_columns: dict[str, tuple[int, int, int]] = {}
        for column, keys in SPAN_ATTRIBUTE_SOURCES.items():
            for rank, key in enumerate(keys):
                span_prio = _SPAN_BASE + rank
                res_base = _RESOURCE_FIRST_BASE if column in RESOURCE_FIRST_COLUMNS else _RESOURCE_BASE
                self.key_columns.setdefault(key, (index[column], span_prio, res_base + rank))

    def redact(self, text: str | bytes) -> str:
        """The redacted form of a value: its UTF-8 length and a keyed hash."""
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        digest = hmac.new(self.hash_key, data, hashlib.sha256).hexdigest()[:16]
        return f"redacted:len={len(data)}:hmac={digest}"

    def is_content(self, key: str) -> bool:
        """True when ``key`` is redacted whatever its length (unless keep_content)."""
        return not self.keep_content and key in CONTENT_ATTRIBUTES

    def too_long(self, text: str) -> bool:
        """True when ``text`` exceeds ``max_attribute_bytes`` and must be redacted."""
        if self.keep_content:
            return False
        n = len(text)
        limit = self.max_attribute_bytes
        if n > limit:
            return True
        if 4 * n <= limit:  # at most 4 UTF-8 bytes per code point
            return False
        return len(text.encode("utf-8", "surrogatepass")) > limit

    def entry(self, key: str, value: Any) -> tuple[str, str, Any, int, int]:
        """Decode one span attribute into ``(key, map_string, typed, slot, priority)``.

        ``slot`` is the index into :data:`CANONICAL_COLUMNS` (``-1`` when the
        key feeds no canonical column) and ``priority`` its span priority.
        ``typed`` is the (possibly redacted) value for the canonical column.
        """
        text = stringify(value)
        if self.is_content(key) or self.too_long(text):
            text = self.redact(text)
            value = text
        elif isinstance(value, str):
            value = text
        mapped = self.key_columns.get(key)
        if mapped is None:
            return (key, text, value, -1, NO_PRIORITY)
        return (key, text, value, mapped[0], mapped[1])

    def resource_entries(self, attributes: Iterable[Any]) -> tuple[list[str], list[str], list[Any], list[int]]:
        """Decode resource attributes (``KeyValue`` messages) once per resource.

        Returns the MAP keys and values (a repeated key keeps its first
        value), and the canonical slot values and priorities the resource contributes (resource-first columns get a
        priority that span attributes cannot beat).
        """
        keys: list[str] = []
        values: list[str] = []
        slot: list[Any] = [None] * len(CANONICAL_COLUMNS)
        prio: list[int] = [NO_PRIORITY] * len(CANONICAL_COLUMNS)
        seen: set[str] = set()
        for kv in attributes:
            if kv.key in seen:
                continue  # a repeated key keeps its first value (MAP keys are unique)
            seen.add(kv.key)
            key, text, typed, column, _ = self.entry(kv.key, any_value_to_python(kv.value))
            keys.append(key)
            values.append(text)
            if column >= 0:
                res_prio = self.key_columns[key][2]
                if res_prio < prio[column]:
                    slot[column] = typed
                    prio[column] = res_prio
        return keys, values, slot, prio

    def map_items(self, attributes: Iterable[Any]) -> tuple[list[str], list[str]]:
        """MAP keys and (redacted) string values of ``KeyValue`` messages; a repeated key keeps its first value."""
        keys: list[str] = []
        values: list[str] = []
        seen: set[str] = set()
        for kv in attributes:
            if kv.key in seen:
                continue  # a repeated key keeps its first value (MAP keys are unique)
            seen.add(kv.key)
            key, text, _typed, _column, _prio = self.entry(kv.key, any_value_to_python(kv.value))
            keys.append(key)
            values.append(text)
        return keys, values
