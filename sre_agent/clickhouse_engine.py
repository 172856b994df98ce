"""The analysis queries run in ClickHouse, over the OTel Collector exporter's tables as they are.

The analysis layer speaks one dialect, DuckDB's, against three relations:
``spans`` (canonical span columns), ``metric_points`` (canonical metric points)
and ``deploys`` (deploy markers). :class:`ClickHouseConnection` answers the
same calls as a DuckDB connection (``execute``/``sql`` and the fetches the
analysis uses) by rewriting each query with sqlglot (a kept transpiler, not
string patches): parameters are bound as literals, the three relations become
subqueries over the exporter's tables (:func:`sre_agent.clickhouse_schema.spans_select`,
:func:`~sre_agent.clickhouse_schema.metric_points_select`, and deploys derived
from the first appearance of each ``service.version``, as the embedded store
derives its automatic ones), and the result is written in ClickHouse SQL. The
quantiles, histograms and samples therefore run in ClickHouse; only their
results come back, as Arrow.

Two backends answer a query: chdb (ClickHouse in-process, for tests, CI and a
single machine; ``chdb:PATH``) and a ClickHouse server over HTTP through
``clickhouse-connect`` (``clickhouse://user:password@host:8123/db``). Both are
optional installs (``pip install 'sre-agent[clickhouse]'``).

What differs between the dialects and is handled here, not in the queries (each
checked against DuckDB itself in tests/core/test_clickhouse_engine.py):

* exact quantiles: ``quantile_cont`` is ``quantileExactInclusive`` (sqlglot would
  write ClickHouse's sampling ``quantile``), ``quantile_disc`` ``quantileExactLow``;
* ``agg(x) FILTER (WHERE c)`` is the ``aggIf(x, c)`` combinator, ``count`` an
  Int64 (UInt64 has no common type with signed integers), ``bool_or``/``bool_and``
  ``max``/``min``, a condition in a select list a ``Bool`` (not ``UInt8``);
* a map lookup of an absent key is NULL (ClickHouse gives ``''``), ``unnest(
  map_entries(m))`` an array join of the keys, ``IS [NOT] DISTINCT FROM`` the
  ``isNotDistinctFrom`` function (ClickHouse takes the syntax only in a JOIN);
* a double cast to an integer rounds half to even (ClickHouse truncates); ``lag``
  before the first row is NULL (ClickHouse gives 0 for a value that is not Nullable);
* NULLs of outer joins and of aggregates over no rows: the session settings below;
* ``CREATE OR REPLACE TEMP TABLE`` drops first; a registered Arrow table is a
  temporary table; DuckDB's catalog is not asked (``dialect`` says so).

The relations' own SQL is ClickHouse's already; it is spliced in after sqlglot has
written the query (for a unique placeholder table name), so that it is not parsed
and rewritten as if it were DuckDB's.
"""

from __future__ import annotations

import copy
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

from sre_agent.clickhouse_result import ClickHouseResult
from sre_agent.clickhouse_schema import (
    ACCELERATED_PREFIX,
    DEFAULT_METRIC_TABLES,
    DEFAULT_TRACES_TABLE,
    metric_points_select,
    spans_select,
)
from sre_agent.errors import StoreError, UsageError

__all__ = ["ClickHouseConnection", "connect_clickhouse"]

_log = logging.getLogger(__name__)

#: Session settings that give ClickHouse DuckDB's NULL semantics for what the analysis reads.
SETTINGS: Final[dict[str, int]] = {
    "join_use_nulls": 1,
    "aggregate_functions_null_for_empty": 1,
}

#: Deploy markers derived from the spans: each version of a service after its first, at its
#: first span (the embedded store's automatic markers, sre_agent.store).
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
        self._relations = {
            # The embedded store's stored parts, with nothing promoted (sre_agent.attribute_sql reads them).
            "spans": "(SELECT *, attributes AS extra_attributes, resource_attributes AS extra_resource_attributes, "
            f"toUInt64(0) AS promoted, toUInt64(0) AS promoted_resource FROM ({canonical}))",
            "metric_points": f"({metric_points_select(metric_tables or DEFAULT_METRIC_TABLES)})",
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

        The same filters as the embedded store's tenant views (sre_agent.server): spans by
        their ``tenant_id``, metric points by a ``tenant.id`` label or resource attribute.
        """
        view = self.cursor()
        quoted = _escaped(tenant)
        view._relations = {
            **self._relations,
            "spans": f"(SELECT * FROM {self._relations['spans']} WHERE tenant_id = '{quoted}')",
            "metric_points": f"(SELECT * FROM {self._relations['metric_points']} "
            f"WHERE coalesce(nullIf(attributes['tenant.id'], ''), resource_attributes['tenant.id']) = '{quoted}')",
        }
        return view

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
            tree = _bind(tree, parameters)
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
        return text

    def _rewrite(self, tree: exp.Expr) -> str:
        local = {cte.alias for cte in tree.find_all(exp.CTE)}
        for table in list(tree.find_all(exp.Table)):
            name = table.name
            if table.db or name in local or name not in ("spans", "metric_points", "deploys"):
                continue
            alias = table.alias or name
            table.replace(
                exp.Table(
                    this=exp.to_identifier(_placeholder(name)), alias=exp.TableAlias(this=exp.to_identifier(alias))
                )
            )
        # Children before parents, so that a respelled node's arguments are respelled already.
        for node in reversed(list(tree.walk())):
            new = _to_clickhouse(node)
            if new is not node:
                if node is tree:
                    tree = new
                else:
                    node.replace(new)
        text: str = tree.sql(dialect="clickhouse")
        return text


#: Aggregates under ``FILTER (WHERE ...)`` by the ClickHouse name that takes the -If combinator.
_COMBINABLE: Final[dict[type[exp.Expr], str]] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Max: "max",
    exp.Min: "min",
    exp.Avg: "avg",
    exp.AnyValue: "any",
}


def _if_combinator(node: exp.Filter) -> exp.Expr:
    """``agg(x) FILTER (WHERE c)`` as ``aggIf(x, c)`` (ClickHouse takes FILTER for few aggregates)."""
    agg, condition = node.this, node.expression.this
    if isinstance(agg, exp.IgnoreNulls):  # DuckDB's any_value ignores NULLs; so does ClickHouse's any
        agg = agg.this
    if isinstance(agg, exp.Anonymous) and agg.name in ("max", "min"):  # bool_or/bool_and respelled
        name, args = agg.name, list(agg.expressions)
    elif type(agg) in _COMBINABLE:
        name = _COMBINABLE[type(agg)]
        args = [] if isinstance(agg.this, exp.Star) or agg.this is None else [agg.this]
        if isinstance(agg, exp.Count) and isinstance(agg.this, exp.Distinct):
            name, args = "uniqExact", list(agg.this.expressions)
    else:
        raise StoreError(f"no ClickHouse spelling for {agg.sql()} FILTER (WHERE ...)")
    return _fn(f"{name}If", *args, condition)


def _escaped(text: str) -> str:
    """``text`` inside a ClickHouse string literal (backslash is an escape there)."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _quoted(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _placeholder(name: str) -> str:
    return f"__sre_agent_{name}__"


def _unnest_map_entries(select: exp.Select) -> None:
    """``unnest(map_entries(m), recursive := true)`` (columns key, value) as ClickHouse's array join of the keys."""
    columns: list[exp.Expr] = []
    for item in select.expressions:
        call = item.this if isinstance(item, exp.Explode | exp.Unnest) else None
        if isinstance(call, exp.Anonymous) and call.name.lower() == "map_entries":
            the_map = call.expressions[0]
            columns.append(exp.alias_(_fn("arrayJoin", _fn("mapKeys", the_map.copy())), "key"))
            columns.append(exp.alias_(exp.Bracket(this=the_map.copy(), expressions=[exp.column("key")]), "value"))
        else:
            columns.append(item)
    select.set("expressions", columns)


def _arithmetic(node: exp.Expr) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div)


_BOOLEAN: Final = (exp.Predicate, exp.Connector, exp.Not, exp.Boolean)


def _is_boolean(node: exp.Expr) -> bool:
    if isinstance(node, exp.Paren):
        return _is_boolean(node.this)
    if isinstance(node, exp.Coalesce):
        return _is_boolean(node.this)
    return isinstance(node, _BOOLEAN)


def _boolean_columns(select: exp.Select) -> None:
    """Columns that are conditions as ``Bool``: ClickHouse gives a comparison as UInt8, DuckDB as BOOLEAN."""
    columns: list[exp.Expr] = []
    for item in select.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if _is_boolean(inner) and not isinstance(inner, exp.Boolean):
            cast = exp.Cast(this=inner.copy(), to=exp.DataType.build("Nullable(Bool)", dialect="clickhouse"))
            name = item.alias_or_name
            columns.append(exp.alias_(cast, name) if name and isinstance(item, exp.Alias | exp.Column) else cast)
        else:
            columns.append(item)
    select.set("expressions", columns)


def _fn(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


#: Map columns: a lookup of an absent key is NULL in DuckDB, '' in ClickHouse.
_MAPS: Final[frozenset[str]] = frozenset(
    {"attributes", "resource_attributes", "extra_attributes", "extra_resource_attributes"}
)
#: DuckDB functions ClickHouse spells otherwise (sqlglot passes them through as written).
_FUNCTIONS: Final[dict[str, str]] = {
    "isfinite": "isFinite",
    "isnan": "isNaN",
    "isinf": "isInfinite",
    # NULL when absent in DuckDB, 0 in ClickHouse: every use here coalesces it to 0.
    "list_position": "indexOf",
    "list_sum": "arraySum",
}
_BITWISE: Final[dict[type[exp.Expr], str]] = {
    exp.BitwiseAnd: "bitAnd",
    exp.BitwiseOr: "bitOr",
    exp.BitwiseXor: "bitXor",
    exp.BitwiseLeftShift: "bitShiftLeft",
    exp.BitwiseRightShift: "bitShiftRight",
}


def _to_clickhouse(node: exp.Expr) -> exp.Expr:
    """One node of a DuckDB query respelled where ClickHouse differs (see the module docstring)."""
    kind = type(node)
    if kind in _BITWISE:
        return _fn(_BITWISE[kind], node.this, node.expression)
    if isinstance(node, exp.Anonymous) and node.name.lower() in _FUNCTIONS:
        return _fn(_FUNCTIONS[node.name.lower()], *node.expressions)
    if isinstance(node, exp.Cast) and node.to.is_type(*exp.DataType.INTEGER_TYPES) and _arithmetic(node.this):
        # DuckDB casts a double to an integer by rounding half to even; ClickHouse truncates.
        return exp.Cast(this=_fn("round", node.this.copy()), to=node.to.copy())
    if isinstance(node, exp.Lag | exp.Lead):
        # Before the first row lag is NULL in DuckDB, but the type's default (0, '') in ClickHouse
        # unless the value is Nullable.
        node.set("this", _fn("toNullable", node.this))
        return node
    if isinstance(node, exp.NullSafeEQ):
        # ClickHouse parses IS NOT DISTINCT FROM outside a JOIN, and then matches nothing.
        return _fn("isNotDistinctFrom", node.this, node.expression)
    if isinstance(node, exp.NullSafeNEQ):
        return exp.Not(this=_fn("isNotDistinctFrom", node.this, node.expression))
    if isinstance(node, exp.Filter):
        combined = _if_combinator(node)
        return _fn("toInt64", combined) if isinstance(node.this, exp.Count) else combined
    if isinstance(node, exp.Count) and not isinstance(node.parent, exp.Filter):
        # count is BIGINT in DuckDB, UInt64 in ClickHouse, which has no common type with Int64.
        return _fn("toInt64", node.copy())
    if isinstance(node, exp.LogicalOr):
        return _fn("max", node.this)
    if isinstance(node, exp.LogicalAnd):
        return _fn("min", node.this)
    if isinstance(node, exp.Select):
        _unnest_map_entries(node)
        _boolean_columns(node)
        return node
    if isinstance(node, exp.PercentileCont | exp.PercentileDisc):
        # quantile_cont: linear between order statistics = quantileExactInclusive; quantile_disc:
        # the order statistic at floor((n - 1) q) = quantileExactLow (both checked on random
        # inputs against DuckDB, tests/core/test_clickhouse_engine.py).
        q = node.expression
        name = "ExactInclusive" if isinstance(node, exp.PercentileCont) else "ExactLow"
        name = ("quantiles" if isinstance(q, exp.Array) else "quantile") + name
        qs = q.expressions if isinstance(q, exp.Array) else [q]
        return exp.ParameterizedAgg(this=name, expressions=qs, params=[node.this])
    if isinstance(node, exp.Bracket) and isinstance(node.this, exp.Column) and node.this.name in _MAPS:
        key = node.expressions[0]
        return exp.If(
            this=_fn("mapContains", node.this.copy(), key.copy()),
            true=exp.Bracket(this=node.this.copy(), expressions=[key.copy()]),
            false=exp.Null(),
        )
    return node


def _bind(tree: exp.Expr, parameters: Sequence[Any] | Mapping[str, Any]) -> exp.Expr:
    """``tree`` with its placeholders replaced by literals: ``?`` in written order, ``$name`` by name."""
    placeholders = list(tree.find_all(exp.Placeholder, bfs=False))  # in the order they are written
    if isinstance(parameters, Mapping):
        for node in placeholders:
            name = str(node.this or "")
            if name not in parameters:
                raise StoreError(f"query parameter ${name} not given")
            node.replace(_literal(parameters[name]))
        return tree
    if len(placeholders) != len(parameters):
        raise StoreError(f"query has {len(placeholders)} parameters, {len(parameters)} given")
    for node, value in zip(placeholders, parameters, strict=True):
        node.replace(_literal(value))
    return tree


def _literal(value: Any) -> exp.Expr:
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        return exp.Literal.number(value)
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, list | tuple):
        return exp.Array(expressions=[_literal(v) for v in value])
    raise StoreError(f"cannot bind a {type(value).__name__} parameter on ClickHouse")


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
