"""SQL that reads span attributes from the stored layout without rebuilding a map.

The ``spans`` view rebuilds ``attributes`` and ``resource_attributes`` whole
(schema.py, "Stored layout"), which costs ~10 us a row: fine for a person's
query over a few thousand spans, far too slow for the diagnosis's scans over
millions. The query code therefore reads attributes through these
spellings, which touch only the stored map and one bit of ``promoted``, and
give the same value the rebuilt map would.
"""

from __future__ import annotations

from typing import Final

from sre_agent.store.schema import MAP_PARTS, PROMOTED_KEYS, promoted_sql
from sre_agent.store.sql_text import literal

__all__ = ["entries_sql", "lookup_sql"]


_INDEX: Final[dict[str, int]] = {key: i for i, (key, _) in enumerate(PROMOTED_KEYS)}


def lookup_sql(key: str, whole_map: str) -> str:
    """``whole_map[key]`` (``attributes`` or ``resource_attributes``) read from the stored parts."""
    stored, bits_column = MAP_PARTS[whole_map]
    direct = f"{stored}[{literal(key)}]"
    index = _INDEX.get(key)
    if index is None:
        return direct
    bit, value = promoted_sql(index, bits_column)
    # A promoted entry is never also in the stored map, so at most one of the two is non-NULL.
    return f"coalesce({direct}, CASE WHEN {bit} THEN {value} END)"


def entries_sql(relation: str, whole_map: str, extra: str = "") -> str:
    """A query over ``relation`` yielding one ``(key, value{extra})`` row per entry of ``whole_map``.

    ``extra`` is appended to each select list (e.g. ``", true AS span_side"``).
    """
    stored, bits_column = MAP_PARTS[whole_map]
    parts = [f"SELECT unnest(map_entries({stored}), recursive := true){extra} FROM {relation}"]
    for index, (key, _) in enumerate(PROMOTED_KEYS):
        bit, value = promoted_sql(index, bits_column)
        parts.append(f"SELECT {literal(key)} AS key, {value} AS value{extra} FROM {relation} WHERE {bit}")
    return " UNION ALL ".join(parts)
