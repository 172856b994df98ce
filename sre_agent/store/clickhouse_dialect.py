"""DuckDB's SQL respelled for ClickHouse on sqlglot's syntax tree (the engine's dialect object).

The analysis writes DuckDB's dialect; :mod:`sre_agent.store.clickhouse` parses each
query with sqlglot, splices its relations in, and asks :func:`respell` for the nodes
whose answers would differ if sqlglot wrote them as they are. :func:`bind` puts
parameters in as literals; :func:`names_wanted` reads which metric names a query
needs, so the exporter's tables are scanned by their ``MetricName`` key.

What differs between the dialects and is respelled here, not in the queries (each
checked against DuckDB itself in tests/core/test_clickhouse_engine.py):

* exact quantiles: ``quantile_cont`` is ``quantileExactInclusive`` (sqlglot would
  write ClickHouse's sampling ``quantile``), ``quantile_disc`` DuckDB's own rank into
  the sorted values (no ClickHouse quantile picks the same order statistic);
* ``agg(x) FILTER (WHERE c)`` is the ``aggIf(x, c)`` combinator, ``count`` an
  Int64 (UInt64 has no common type with signed integers), ``bool_or``/``bool_and``
  ``max``/``min``, a condition in a select list (also ``bool_or`` of one) a ``Bool`` (not ``UInt8``);
* a map lookup of an absent key is NULL (ClickHouse gives ``''``), ``unnest(
  map_entries(m))`` an array join of the keys, ``IS [NOT] DISTINCT FROM`` the
  ``isNotDistinctFrom`` function (ClickHouse takes the syntax only in a JOIN);
* a double cast to an integer rounds half to even (ClickHouse truncates); ``lag``
  before the first row is NULL (ClickHouse gives 0 for a value that is not Nullable);
* ``list(x)`` and ``list_sort`` are ``groupArray`` and ``arraySort`` (over non-NULL values).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from sqlglot import exp

from sre_agent.errors import StoreError

__all__ = ["bind", "names_wanted", "respell", "to_clickhouse"]


def respell(tree: exp.Expr) -> exp.Expr:
    """``tree`` with every node :func:`to_clickhouse` respells replaced (in place where it can be)."""
    # Children before parents, so that a respelled node's arguments are respelled already.
    for node in reversed(list(tree.walk())):
        new = to_clickhouse(node)
        if new is not node:
            if node is tree:
                tree = new
            else:
                node.replace(new)
    return tree


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


def names_wanted(table: exp.Table) -> frozenset[str] | None:
    """Metric names a query's rows of ``table`` must have, from its WHERE (None: any name).

    Read only when ``table`` is the query's one source: ``name = 'x'``, ``name IN (...)``,
    and their AND and OR. The relation keeps its own ``name`` filter; this only narrows the scan.
    """
    select = table.parent_select
    if select is None or select.args.get("joins") or select.args.get("from_") is None:
        return None
    if select.args["from_"].this is not table:
        return None
    where = select.args.get("where")

    def wanted(node: exp.Expr) -> frozenset[str] | None:
        if isinstance(node, exp.Paren):
            return wanted(node.this)
        if isinstance(node, exp.Or):
            left, right = wanted(node.this), wanted(node.expression)
            return None if left is None or right is None else left | right
        if isinstance(node, exp.And):
            left, right = wanted(node.this), wanted(node.expression)
            return right if left is None else left if right is None else left & right
        values = [node.expression] if isinstance(node, exp.EQ) else node.expressions if isinstance(node, exp.In) else []
        column = node.this
        if not values or not isinstance(column, exp.Column) or column.name != "name":
            return None
        if column.table and column.table != (table.alias or table.name):
            return None
        if not all(isinstance(v, exp.Literal) and v.is_string for v in values):
            return None
        return frozenset(v.this for v in values)

    return None if where is None else wanted(where.this)


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


#: ``bool_or``/``bool_and`` as respelled (:func:`to_clickhouse`), also under FILTER: an aggregate of a condition.
_BOOLEAN_AGGREGATES: Final = frozenset({"max", "min", "maxIf", "minIf"})


def _is_boolean(node: exp.Expr) -> bool:
    if isinstance(node, exp.Paren | exp.Coalesce):
        return _is_boolean(node.this)
    if isinstance(node, exp.Anonymous) and node.name in _BOOLEAN_AGGREGATES and node.expressions:
        # Respelled before the select list is read (children first): max of a condition is one.
        return _is_boolean(node.expressions[0])
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


def _if_any(values: exp.Expr, answer: exp.Expr) -> exp.Expr:
    """``answer``, or NULL over no non-NULL value (DuckDB's quantile of nothing)."""
    empty = exp.EQ(this=_fn("count", values.copy()), expression=exp.Literal.number(0))
    return exp.If(this=empty, true=exp.Null(), false=answer)


def _order_statistic(values: exp.Expr, q: exp.Expr) -> exp.Expr:
    """DuckDB's ``quantile_disc(values, q)``: the ``ceil(n q)``-th smallest (1-based, at least 1).

    ClickHouse's ``quantileExactLow`` takes ``floor(n q)`` (0-based), which differs wherever
    ``n q`` is a whole number (q = 1/3 of 3 values), and no ClickHouse quantile matches there.
    DuckDB reads a plain decimal literal as DECIMAL and computes the rank exactly (0.7 of 10
    is the 7th, where the double 10 * 0.7 is 7.000000000000001); any other ``q`` as a double,
    as ``n - floor(n - n q)``. Both are written here with the same arithmetic.
    """
    n = _fn("count", values.copy())
    text = q.this if isinstance(q, exp.Literal) and not q.is_string else ""
    if re.fullmatch(r"\d*\.(\d+)", text) and len(text) <= 39:
        scale = len(text.split(".")[1])
        fraction = _fn("toDecimal128", exp.Literal.string(text), exp.Literal.number(scale))
        rank = _fn("ceil", exp.Mul(this=_fn("toDecimal128", n, exp.Literal.number(0)), expression=fraction))
    else:
        scaled = exp.Mul(this=n.copy(), expression=_fn("toFloat64", q.copy()))
        rank = exp.Sub(this=n.copy(), expression=_fn("floor", exp.Sub(this=n.copy(), expression=scaled)))
    index = _fn("greatest", _fn("toUInt64", rank), exp.Literal.number(1))
    return _fn("arrayElement", _fn("arraySort", _fn("groupArray", values.copy())), index)


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


def to_clickhouse(node: exp.Expr) -> exp.Expr:
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
    if isinstance(node, exp.PercentileCont):
        # quantile_cont: linear between order statistics = quantileExactInclusive (checked on
        # random inputs against DuckDB, tests/core/test_clickhouse_engine.py).
        q = node.expression
        name = "quantilesExactInclusive" if isinstance(q, exp.Array) else "quantileExactInclusive"
        qs = q.expressions if isinstance(q, exp.Array) else [q]
        return exp.ParameterizedAgg(this=name, expressions=qs, params=[node.this])
    if isinstance(node, exp.PercentileDisc):
        q = node.expression
        if isinstance(q, exp.Array):
            return _if_any(node.this, exp.Array(expressions=[_order_statistic(node.this, p) for p in q.expressions]))
        return _if_any(node.this, _order_statistic(node.this, q))
    if isinstance(node, exp.ArrayAgg):
        # NULLs: kept by DuckDB's list(), skipped by groupArray; callers aggregate non-NULL values.
        return _fn("groupArray", node.this)
    if isinstance(node, exp.ArraySort) and not node.expression:
        return _fn("arraySort", node.this)
    if isinstance(node, exp.Bracket) and isinstance(node.this, exp.Column) and node.this.name in _MAPS:
        key = node.expressions[0]
        return exp.If(
            this=_fn("mapContains", node.this.copy(), key.copy()),
            true=exp.Bracket(this=node.this.copy(), expressions=[key.copy()]),
            false=exp.Null(),
        )
    return node


def bind(tree: exp.Expr, parameters: Sequence[Any] | Mapping[str, Any]) -> exp.Expr:
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
