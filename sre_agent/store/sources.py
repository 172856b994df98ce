"""Where the analysis reads: the embedded DuckDB store, or ClickHouse at fleet scale.

``open_source(config)`` is the one place a command turns its configuration into
something :func:`sre_agent.diagnose` and the canary read: a read-only
:class:`~sre_agent.store.embedded.Store` for ``--db PATH`` / ``--store duckdb:PATH``, or a
:class:`~sre_agent.store.clickhouse.ClickHouseConnection` over the OTel
Collector exporter's tables for ``--store chdb:PATH`` or
``--store clickhouse://user@host:8123/db``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sre_agent.config import Config
from sre_agent.errors import UsageError

__all__ = ["open_connection", "open_source"]


def open_connection(config: Config) -> Any:
    """A :class:`~sre_agent.store.clickhouse.ClickHouseConnection` to the ClickHouse store ``config`` names.

    Checks that the exporter's tables are there (a clear :class:`StoreError` otherwise);
    the caller closes it.
    """
    if config.clickhouse is None:
        raise UsageError("no ClickHouse store configured (store = chdb:PATH or clickhouse://...)")
    try:
        from sre_agent.store.clickhouse import connect_clickhouse
    except ImportError as exc:  # sqlglot: the clickhouse extra is not installed
        raise UsageError(
            f"reading {config.clickhouse} needs the ClickHouse extra: pip install 'sre-agent[clickhouse]' ({exc})"
        ) from exc
    base = config.clickhouse_metrics_table
    metric_tables = {kind: f"{base}_{kind}" for kind in ("gauge", "sum", "histogram")}
    connection = connect_clickhouse(
        config.clickhouse, traces_table=config.clickhouse_traces_table, metric_tables=metric_tables
    )
    try:
        connection.check_tables(config.clickhouse_traces_table, metric_tables)
    except BaseException:
        connection.close()
        raise
    return connection


@contextmanager
def open_source(config: Config) -> Iterator[Any]:
    """The store ``config`` names, opened for reading, closed on exit."""
    if config.clickhouse is not None:
        connection = open_connection(config)
        try:
            yield connection
        finally:
            connection.close()
        return
    from sre_agent.store.embedded import Store

    with Store.open(config.duckdb_path, read_only=True) as store:
        yield store
