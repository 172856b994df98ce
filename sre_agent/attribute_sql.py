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

from sre_agent.resolve import quote
from sre_agent.schema import PROMOTED_KEYS, RESOURCE_BIT_OFFSET

__all__ = ["MAP_PARTS", "entries_sql", "lookup_sql"]


#: Each whole map of the ``spans`` view -> (its stored part, the offset of its bits in ``promoted``).
MAP_PARTS: Final[dict[str, tuple[str, int]]] = {
    "attributes": ("extra_attributes", 0),
    "resource_attributes": ("extra_resource_attributes", RESOURCE_BIT_OFFSET),
}
_INDEX: Final[dict[str, int]] = {key: i for i, (key, _) in enumerate(PROMOTED_KEYS)}


def _promoted_value(key: str, offset: int) -> str | None:
    index = _INDEX.get(key)
    if index is None:
        return None
    column = PROMOTED_KEYS[index][1]
    return f"CASE WHEN (promoted >> {offset + index}) & 1 = 1 THEN CAST({column} AS VARCHAR) END"


def lookup_sql(key: str, whole_map: str) -> str:
    """``whole_map[key]`` (``attributes`` or ``resource_attributes``) read from the stored parts."""
    stored, offset = MAP_PARTS[whole_map]
    direct = f"{stored}[{quote(key)}]"
    promoted = _promoted_value(key, offset)
    # A promoted entry is never also in the stored map, so at most one of the two is non-NULL.
    return direct if promoted is None else f"coalesce({direct}, {promoted})"


def entries_sql(relation: str, whole_map: str, extra: str = "") -> str:
    """A query over ``relation`` yielding one ``(key, value{extra})`` row per entry of ``whole_map``.

    ``extra`` is appended to each select list (e.g. ``", true AS span_side"``).
    """
    stored, offset = MAP_PARTS[whole_map]
    parts = [f"SELECT unnest(map_entries({stored}), recursive := true){extra} FROM {relation}"]
    for index, (key, column) in enumerate(PROMOTED_KEYS):
        parts.append(
            f"SELECT {quote(key)} AS key, CAST({column} AS VARCHAR) AS value{extra} FROM {relation} "
            f"WHERE (promoted >> {offset + index}) & 1 = 1"
        )
    return " UNION ALL ".join(parts)
