"""SQL text the analysis layer spells itself: string literals and identifiers.

Values that vary per call go in as query parameters; these two are for the
places DuckDB cannot take a parameter (a column name, a ``MAP`` key inside an
expression that must stay constant-folded, a list literal that a prepared
statement made several times slower on 10M rows). A leaf module: it imports
nothing, so every layer may use it.
"""

from __future__ import annotations

__all__ = ["dialect_of", "ident", "literal"]


def dialect_of(con: object) -> str:
    """The SQL engine behind a connection: ``duckdb``, or what a stand-in declares (``clickhouse``).

    :class:`sre_agent.store.clickhouse.ClickHouseConnection` answers DuckDB's calls; the few
    places that ask DuckDB's catalog or open a second cursor ask this first.
    """
    return str(getattr(con, "dialect", "duckdb"))


def literal(value: str) -> str:
    """``value`` as a SQL string literal (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (double quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'
