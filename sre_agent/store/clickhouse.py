"""The analysis queries run in ClickHouse, over the OTel Collector exporter's tables as they are.

The analysis layer speaks one dialect, DuckDB's, against three relations:
``spans`` (canonical span columns), ``metric_points`` (canonical metric points)
and ``deploys`` (deploy markers). :class:`ClickHouseConnection` answers the
same calls as a DuckDB connection (``execute``/``sql`` and the fetches the
analysis uses) by rewriting each query with sqlglot (a kept transpiler, not
string patches): parameters are bound as literals, the three relations become
subqueries over the exporter's tables (:func:`sre_agent.store.clickhouse_schema.spans_select`,
:func:`~sre_agent.store.clickhouse_schema.metric_points_select`, and deploys derived
from the first appearance of each ``service.version``, as the embedded store
derives its automatic ones), and the result is written in ClickHouse SQL. The
quantiles, histograms and samples therefore run in ClickHouse; only their
results come back, as Arrow.

Two backends answer a query: chdb (ClickHouse in-process, for tests, CI and a
single machine; ``chdb:PATH``) and a ClickHouse server over HTTP through
``clickhouse-connect`` (``clickhouse://user:password@host:8123/db``). Both are
optional installs (``pip install 'sre-agent[clickhouse]'``).

What differs between the dialects is respelled on the parsed query by
:mod:`sre_agent.store.clickhouse_dialect` (its docstring lists it).
Handled here: NULLs of outer joins and of aggregates over no rows (the session
settings below); ``CREATE OR REPLACE TEMP TABLE`` drops first; a registered Arrow
table is a temporary table; DuckDB's catalog is not asked (``dialect`` says so); a
filter on metric names narrows the exporter's scan to those ``MetricName`` values.

The relations' own SQL is ClickHouse's already; it is spliced in after sqlglot has
written the query (for a unique placeholder table name), so that it is not parsed
and rewritten as if it were DuckDB's.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import logging
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlparse

import pyarrow as pa
import sqlglot
from sqlglot import exp

from sre_agent.errors import StoreError, UsageError
from sre_agent.store.clickhouse_dialect import bind, names_wanted, respell
from sre_agent.store.clickhouse_result import ClickHouseResult
from sre_agent.store.clickhouse_schema import (
    ACCELERATED_PREFIX,
    DEFAULT_METRIC_TABLES,
    DEFAULT_TRACES_TABLE,
    metric_points_select,
    spans_select,
)

__all__ = ["ClickHouseConnection", "connect_clickhouse"]

_log = logging.getLogger(__name__)

#: Session settings that give ClickHouse DuckDB's NULL semantics for what the analysis reads.
SETTINGS: Final[dict[str, int]] = {
    "join_use_nulls": 1,
    "aggregate_functions_null_for_empty": 1,
}

#: Deploy markers derived from the spans: each version of a service after its first, at its
#: first span (the embedded store's automatic markers, sre_agent.store.embedded).
_DEPLOYS_SQL: Final[str] = """
SELECT first_ns AS time_ns, service_name, service_version AS version,
  lag(service_version) OVER (PARTITION BY service_name ORDER BY first_ns) AS previous_version,
  'auto' AS source, CAST(NULL AS VARCHAR) AS note
FROM (
  SELECT service_name, service_version, min(start_ns) AS first_ns FROM spans
  WHERE service_name IS NOT NULL AND service_version IS NOT NULL GROUP BY service_name, service_version
)
QUALIFY previous_version IS NOT NULL
"""

_Query = Callable[[str], pa.Table]
#: Loads an Arrow table into a new temporary table of the given name.
_Load = Callable[[str, pa.Table], None]


class ClickHouseConnection:
    """The analysis layer's connection, answered by ClickHouse over the exporter's tables.

    ``query`` runs one ClickHouse statement and returns Arrow; queries are
    serialised (chdb's session is not safe for concurrent use).
    """

    #: Read by the analysis where DuckDB's catalog would be asked (resolve.scan_relation).
    dialect: Final[str] = "clickhouse"

    def __init__(
        self,
        query: _Query,
        load: _Load,
        *,
        traces_table: str = DEFAULT_TRACES_TABLE,
        metric_tables: dict[str, str] | None = None,
        close: Callable[[], None] | None = None,
    ) -> None:
        self._query = query
        self._load = load
        self._close = close
        self._lock = threading.Lock()
        #: Canonical span columns the traces table keeps as materialized columns (read as they are).
        self.accelerated = self._accelerated(traces_table)
        canonical = spans_select(traces_table, self.accelerated)
        self._metric_tables = metric_tables or DEFAULT_METRIC_TABLES
        self._tenant: str | None = None
        #: Metric-point relations pre-filtered by name (:meth:`_rewrite`), by placeholder.
        self._by_name: dict[str, str] = {}
        self._relations = {
            # The embedded store's stored parts, with nothing promoted (sre_agent.store.attribute_sql reads them).
            "spans": "(SELECT *, attributes AS extra_attributes, resource_attributes AS extra_resource_attributes, "
            f"toUInt64(0) AS promoted, toUInt64(0) AS promoted_resource FROM ({canonical}))",
            "metric_points": self._metric_relation(None),
        }
        deploys = sqlglot.parse_one(_DEPLOYS_SQL, read="duckdb")
        self._relations["deploys"] = f"({self._rewrite(deploys)})"

    def _accelerated(self, table: str) -> frozenset[str]:
        """The canonical columns ``table`` keeps as materialized columns (clickhouse_schema.acceleration_ddl)."""
        database, _, name = table.rpartition(".")
        where = f"database = '{_escaped(database)}'" if database else "database = currentDatabase()"
        found = self._query(
            f"SELECT name FROM system.columns WHERE {where} AND table = '{_escaped(name)}' "
            f"AND startsWith(name, '{ACCELERATED_PREFIX}')"
        )
        return frozenset(str(c).removeprefix(ACCELERATED_PREFIX) for c in found.column(0).to_pylist())

    def check_tables(self, traces_table: str, metric_tables: dict[str, str]) -> None:
        """Raise a clear :class:`StoreError` when the exporter's tables are not where they are expected."""
        wanted = [traces_table, *metric_tables.values()]
        names = ", ".join(f"'{t}'" for t in wanted)
        qualified = "if(database = currentDatabase(), name, database || '.' || name)"
        found = set(
            self.native(f"SELECT {qualified} FROM system.tables WHERE {qualified} IN ({names})").column(0).to_pylist()
        )
        missing = [t for t in wanted if t not in found]
        if missing:
            raise StoreError(
                f"no table {', '.join(missing)} here: sre-agent reads the OTel Collector ClickHouse exporter's "
                "tables (set clickhouse_traces_table / clickhouse_metrics_table if they are named otherwise)"
            )

    # -------------------------------------------------------------- DuckDB-like calls
    def execute(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None) -> ClickHouseResult:
        """Run ``sql`` (DuckDB dialect, ``?`` parameters) and hold its rows."""
        statements = self.translate(sql, parameters)
        with self._lock:
            table = pa.table({})
            for statement in statements:
                try:
                    table = self._query(statement)
                except Exception as exc:
                    _log.debug("ClickHouse refused %s\n-- translated from --\n%s", statement, sql)
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    cut = first.split(" In scope ")[0]  # ClickHouse appends the whole query
                    raise StoreError(f"ClickHouse: {cut[:400]}") from exc
            return ClickHouseResult(table)

    def sql(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> ClickHouseResult:
        """As :meth:`execute` (DuckDB's relational ``sql``)."""
        return self.execute(sql, params)

    def native(self, sql: str) -> pa.Table:
        """Run a statement written for ClickHouse as it is (no translation, no relations)."""
        with self._lock:
            return self._query(sql)

    def register(self, name: str, table: pa.Table) -> None:
        """Make ``table`` queryable as ``name`` (a temporary table; DuckDB registers a view of it)."""
        with self._lock:
            self._query(f"DROP TEMPORARY TABLE IF EXISTS {_quoted(name)}")
            self._load(name, table)

    def unregister(self, name: str) -> None:
        """Drop what :meth:`register` made."""
        with self._lock:
            self._query(f"DROP TEMPORARY TABLE IF EXISTS {_quoted(name)}")

    def cursor(self) -> ClickHouseConnection:
        """A view of this connection whose :meth:`close` leaves the session open.

        Queries through every view are serialised on the one session (chdb's cannot
        run two at once, and one process may hold a chdb directory).
        """
        view = copy.copy(self)
        view._close = None
        return view

    def scoped(self, tenant: str) -> ClickHouseConnection:
        """A view that sees only ``tenant``'s spans and metric points (a tenant-scoped API token).

        The same filters as the embedded store's tenant views (sre_agent.api.server): spans by
        their ``tenant_id``, metric points by a ``tenant.id`` label or resource attribute.
        """
        view = self.cursor()
        quoted = _escaped(tenant)
        view._tenant = tenant
        view._relations = {
            **self._relations,
            "spans": f"(SELECT * FROM {self._relations['spans']} WHERE tenant_id = '{quoted}')",
            "metric_points": view._metric_relation(None),
        }
        return view

    def _metric_relation(self, names: frozenset[str] | None) -> str:
        """The ``metric_points`` relation, only rows that may be named ``names`` when given, tenant-scoped."""
        text = f"({metric_points_select(self._metric_tables, names)})"
        if self._tenant is None:
            return text
        quoted = _escaped(self._tenant)
        tenant = "coalesce(nullIf(attributes['tenant.id'], ''), resource_attributes['tenant.id'])"
        return f"(SELECT * FROM {text} WHERE {tenant} = '{quoted}')"

    def close(self) -> None:
        """Release the backend's session or client."""
        if self._close is not None:
            self._close()
            self._close = None

    # -------------------------------------------------------------- translation
    def translate(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None) -> list[str]:
        """``sql`` as ClickHouse statements over the exporter's tables (run in order; the last one's rows count)."""
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
        if len(statements) != 1:
            raise StoreError(f"one statement per query on ClickHouse, got {len(statements)}")
        tree = statements[0]
        if isinstance(tree, exp.Set):
            return []  # DuckDB session settings (its progress bar) mean nothing here
        if parameters:
            tree = bind(tree, parameters)
        prefix: list[str] = []
        if isinstance(tree, exp.Create) and tree.args.get("replace"):
            # CREATE OR REPLACE TEMP TABLE: ClickHouse replaces by dropping first.
            prefix.append(f"DROP TEMPORARY TABLE IF EXISTS {tree.this.sql(dialect='clickhouse')}")
            tree.set("replace", False)
        return [*prefix, self._expand(self._rewrite(tree))]

    def _expand(self, text: str) -> str:
        # deploys first: its own text reads spans.
        for name in ("deploys", "spans", "metric_points"):
            text = text.replace(_placeholder(name), self._relations[name])
        for key, relation in list(self._by_name.items()):
            text = text.replace(key, relation)
        return text

    def _rewrite(self, tree: exp.Expr) -> str:
        local = {cte.alias for cte in tree.find_all(exp.CTE)}
        for table in list(tree.find_all(exp.Table)):
            name = table.name
            if table.db or name in local or name not in ("spans", "metric_points", "deploys"):
                continue
            alias = table.alias or name
            key = _placeholder(name)
            names = names_wanted(table) if name == "metric_points" else None
            if names is not None:
                # The exporter's tables are ordered by MetricName: a filter on it skips granules, one on the
                # canonical name (an expression over it) reads every row.
                spelled = repr((self._tenant, sorted(names))).encode()
                key = _placeholder(f"metric_points_{hashlib.sha1(spelled, usedforsecurity=False).hexdigest()}")
                self._by_name.setdefault(key, self._metric_relation(names))
            table.replace(exp.Table(this=exp.to_identifier(key), alias=exp.TableAlias(this=exp.to_identifier(alias))))
        text: str = respell(tree).sql(dialect="clickhouse")
        return text


def _escaped(text: str) -> str:
    """``text`` inside a ClickHouse string literal (backslash is an escape there)."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _quoted(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _placeholder(name: str) -> str:
    return f"__sre_agent_{name}__"


def connect_clickhouse(
    url: str, *, traces_table: str = DEFAULT_TRACES_TABLE, metric_tables: dict[str, str] | None = None
) -> ClickHouseConnection:
    """Open ``chdb:PATH`` (in-process) or ``clickhouse://user:password@host:8123/db`` (a server)."""
    if url.startswith("chdb:"):
        try:
            # Any: chdb ships no type information.
            session: Any = importlib.import_module("chdb.session")
        except ImportError as exc:
            raise UsageError("chdb is not installed: pip install 'sre-agent[clickhouse]'") from exc
        path = url.removeprefix("chdb:")
        if path and not Path(path).is_dir():
            raise StoreError(f"no chdb database at {path}")
        db = session.Session(path or None)
        settings = " ".join(f"SET {k} = {v};" for k, v in SETTINGS.items())
        for statement in settings.split(";"):
            if statement.strip():
                db.query(statement)

        def run(query: str) -> pa.Table:
            table: pa.Table = db.query(query, "ArrowTable")
            return table

        _check_settings(run)

        def load(name: str, table: pa.Table) -> None:
            # In-process: through a Parquet file, which ClickHouse reads with the types Arrow gave.
            import pyarrow.parquet as pq

            with tempfile.TemporaryDirectory(prefix="sre-agent-chdb-") as scratch:
                path = Path(scratch) / "rows.parquet"
                pq.write_table(table, path)
                db.query(
                    f"CREATE TEMPORARY TABLE {_quoted(name)} ENGINE = Memory AS SELECT * FROM file('{path}', Parquet)"
                )

        return ClickHouseConnection(run, load, traces_table=traces_table, metric_tables=metric_tables, close=db.close)
    parsed = urlparse(url)
    if parsed.scheme not in ("clickhouse", "clickhouses"):
        raise UsageError(f"not a ClickHouse store: {url!r} (chdb:PATH or clickhouse://user@host:8123/db)")
    try:
        import clickhouse_connect
    except ImportError as exc:
        raise UsageError("clickhouse-connect is not installed: pip install 'sre-agent[clickhouse]'") from exc
    client = clickhouse_connect.get_client(
        host=parsed.hostname or "localhost",
        port=parsed.port or 8123,
        username=unquote(parsed.username or "default"),
        password=unquote(parsed.password or ""),
        database=parsed.path.lstrip("/") or "default",
        secure=parsed.scheme == "clickhouses",
        settings=dict(SETTINGS),
    )

    def run_remote(query: str) -> pa.Table:
        table: pa.Table = client.query_arrow(query)
        # A user who may not change output settings gets String columns as binary.
        for i, field_ in enumerate(table.schema):
            if pa.types.is_binary(field_.type) or pa.types.is_large_binary(field_.type):
                table = table.set_column(i, field_.name, table.column(i).cast(pa.string()))
        return table

    def load_remote(name: str, table: pa.Table) -> None:
        columns = ", ".join(f"{_quoted(f.name)} {_clickhouse_type(f.type)}" for f in table.schema)
        client.command(f"CREATE TEMPORARY TABLE {_quoted(name)} ({columns}) ENGINE = Memory")
        client.insert_arrow(name, table)

    _check_settings(run_remote)
    return ClickHouseConnection(
        run_remote, load_remote, traces_table=traces_table, metric_tables=metric_tables, close=client.close
    )


def _check_settings(run: _Query) -> None:
    """Refuse a session whose NULL semantics are not DuckDB's (a read-only user may not set them)."""
    names = ", ".join(f"toString(toUInt8(getSetting('{name}')))" for name in SETTINGS)
    got = [str(v) for v in run(f"SELECT {names}").to_pylist()[0].values()]
    wrong = [f"{name}={value}" for name, value in zip(SETTINGS, got, strict=True) if value != str(SETTINGS[name])]
    if wrong:
        wanted = ", ".join(f"{k}={v}" for k, v in SETTINGS.items())
        raise StoreError(
            f"the ClickHouse user's session has {', '.join(wrong)}; sre-agent needs {wanted} "
            "(a user with readonly=2, or these in its settings profile)"
        )


def _clickhouse_type(kind: pa.DataType) -> str:
    """The Nullable ClickHouse type of an Arrow column registered from a frame."""
    if pa.types.is_boolean(kind):
        return "Nullable(Bool)"
    if pa.types.is_integer(kind):
        return "Nullable(Int64)"
    if pa.types.is_floating(kind):
        return "Nullable(Float64)"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "Nullable(String)"
    raise StoreError(f"cannot register an Arrow {kind} column on ClickHouse")
