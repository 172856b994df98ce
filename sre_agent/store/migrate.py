"""Schema versions of the store file and the migrations that bring an older file to this one.

Run by :meth:`sre_agent.store.embedded.Store.open` before anything reads the file, read-only opens
included (:func:`upgrade_in_place`). Nothing stored is lost or read differently: each step
adds or renames, and the one rewrite (schema 2 -> 3) moves bits between two columns.
"""

from __future__ import annotations

import contextlib
import logging

import duckdb

from sre_agent.errors import StoreError
from sre_agent.store.schema import SPAN_COLUMNS, SPANS_VIEW_DDL

__all__ = ["META_DDL", "SCHEMA_VERSION", "migrate", "needs_upgrade", "upgrade_in_place"]

# 2: spans became a view over span_rows, which stores promoted attributes once (schema.py, "Stored layout").
# 3: request parameters (max_tokens, temperature, top_p, choice_count) promoted; resource bits apart.
SCHEMA_VERSION = "3"

META_DDL = "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)"

log = logging.getLogger(__name__)


def _has_old_layout(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``spans`` is still a table (schema 1, before ``span_rows``)."""
    row = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main' AND table_name = 'spans' "
        "AND table_type = 'BASE TABLE'"
    ).fetchone()
    return bool(row and row[0])


def _migrate_spans(con: duckdb.DuckDBPyConnection) -> None:
    """Schema 1 -> 2 without rewriting a row: the old table becomes ``span_rows`` with whole maps.

    Old rows keep every attribute in their maps and ``promoted = 0``, which
    the ``spans`` view reads back as it is, so nothing stored changes.
    """
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("ALTER TABLE spans RENAME TO span_rows")
        con.execute("ALTER TABLE span_rows RENAME COLUMN resource_attributes TO extra_resource_attributes")
        con.execute("ALTER TABLE span_rows RENAME COLUMN attributes TO extra_attributes")
        con.execute("ALTER TABLE span_rows ADD COLUMN promoted BIGINT DEFAULT 0")
        con.execute(META_DDL)  # files written by DuckDB alone (not through Store) have none
        con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', '2')")
        con.execute("COMMIT")
    except duckdb.Error:
        con.execute("ROLLBACK")
        raise
    log.info("store migrated to schema 2 (spans is now a view over span_rows)")


def _span_row_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'main' AND table_name = 'span_rows'"
    ).fetchall()
    return [row[0] for row in rows]


def needs_upgrade(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the spans are in a layout older than this schema (1: a table; 2: one bit column)."""
    if _has_old_layout(con):
        return True
    columns = _span_row_columns(con)
    return bool(columns) and "promoted_resource" not in columns


def _split_promoted_bits(con: duckdb.DuckDBPyConnection) -> None:
    """Schema 2 -> 3: the request-parameter columns, and the resource map's bits in their own column.

    Schema 2 kept a resource entry's bit at 32 + its index in ``promoted``; there was no room
    for more keys. Rows stored before keep their request parameters in the maps (the new
    columns are NULL there, which the ``spans`` view reads as it always did). The bit move
    rewrites one column of the rows that had a resource bit (a few seconds per 10M rows).
    """
    con.execute("BEGIN TRANSACTION")
    try:
        present = set(_span_row_columns(con))
        for column in SPAN_COLUMNS:
            if column.name not in present and column.name not in ("attributes", "resource_attributes"):
                con.execute(f"ALTER TABLE span_rows ADD COLUMN {column.name} {column.duckdb}")
        con.execute("ALTER TABLE span_rows ADD COLUMN promoted_resource BIGINT DEFAULT 0")
        con.execute(
            "UPDATE span_rows SET promoted_resource = promoted >> 32, promoted = promoted & 4294967295 "
            "WHERE promoted >= 4294967296"
        )
        con.execute(SPANS_VIEW_DDL)
        con.execute(META_DDL)  # files written by DuckDB alone (not through Store) have none
        con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])
        con.execute("COMMIT")
    except duckdb.Error:
        con.execute("ROLLBACK")
        raise
    log.info("store migrated to schema %s (request parameters as columns, resource bits apart)", SCHEMA_VERSION)


def migrate(con: duckdb.DuckDBPyConnection) -> None:
    """Bring an older store's span layout to this schema; nothing stored is lost or read differently."""
    if _has_old_layout(con):
        _migrate_spans(con)
    if needs_upgrade(con):
        _split_promoted_bits(con)


def upgrade_in_place(path: str) -> None:
    """Migrate an older store before a read-only open (one writable open; see :func:`migrate`)."""
    try:
        with contextlib.closing(duckdb.connect(path)) as con:
            migrate(con)
    except duckdb.Error as exc:
        raise StoreError(
            f"the store {path} has an older span layout, and upgrading it needs one writable open ({exc}). "
            "Open it once with a writing command (e.g. `sre-agent ingest --db PATH` on an empty file, or "
            "`sre-agent serve --db PATH`), or copy it somewhere writable first."
        ) from exc
