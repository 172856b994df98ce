"""The analysis dialect (DuckDB's) answered by ClickHouse: each respelling checked against DuckDB itself.

Every case runs the same DuckDB-dialect query on a DuckDB connection and through
:class:`sre_agent.store.clickhouse.ClickHouseConnection` on chdb (ClickHouse
in-process) over the same rows, and the answers must agree. Opt-in
(``-m clickhouse``; ``pip install -e '.[clickhouse]'``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sre_agent.errors import StoreError

pytestmark = pytest.mark.clickhouse

ROWS = pa.table(
    {
        "k": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        "x": pa.array([0.5, 1.25, None, 4.0, 2.5, 3.5], pa.float64()),
        "s": pa.array(["a", "b", None, "a", "c", "b"], pa.string()),
    }
)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[duckdb.DuckDBPyConnection, Any]]:
    """A DuckDB connection and a chdb-backed ClickHouseConnection, each with table ``t`` = ROWS."""
    from sre_agent.store.clickhouse import connect_clickhouse

    duck = duckdb.connect()
    duck.register("t_rows", ROWS)
    duck.execute("CREATE TABLE t AS SELECT * FROM t_rows")
    house = connect_clickhouse("chdb:")
    house.register("t", ROWS)
    yield duck, house
    house.close()
    duck.close()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize(
    ("query", "parameters"),
    [
        # exact quantiles, continuous and discrete, one and several at once
        ("SELECT quantile_cont(x, 0.9), quantile_disc(x, 0.5) FROM t", None),
        ("SELECT quantile_cont(x, [0.25, 0.75]), quantile_disc(x, [0.1, 0.99]) FROM t", None),
        # aggregates under FILTER, and count's type (BIGINT: greatest() mixes it with a signed int)
        ("SELECT count(*) FILTER (WHERE x > 1), max(x) FILTER (WHERE s = 'a'), greatest(count(*), -1) FROM t", None),
        ("SELECT any_value(s) FILTER (WHERE k = 4), bool_or(x > 3), bool_and(x > 0) FROM t", None),
        # parameters bound in the order they are written, NULL-safe comparison
        ("SELECT count(*) FROM t WHERE s IS NOT DISTINCT FROM ? AND k > ?", ["b", 2]),
        ("SELECT count(*) FROM t WHERE s IS DISTINCT FROM ?", [None]),
        # a condition is a BOOLEAN column (ClickHouse would give UInt8)
        ("SELECT k, x > 1 AS big, coalesce(x < 2, false) AS small FROM t ORDER BY k", None),
        # a double cast to an integer rounds half to even (ClickHouse truncates)
        ("SELECT CAST(x * 3 AS BIGINT), CAST(k / 2 AS INTEGER) FROM t ORDER BY k", None),
        # bitwise operators and a CTE that shadows nothing
        ("WITH w AS (SELECT k & 3 AS a, k | 8 AS b, k >> 1 AS c FROM t) SELECT * FROM w ORDER BY a, b", None),
        ("SELECT isfinite(x), isnan(x) FROM t ORDER BY k", None),
        # lag before the first row of a partition is NULL, also of a value that is never NULL
        (
            "SELECT k, lag(1) OVER (ORDER BY k), lag(k * 2) OVER w FROM t WINDOW w AS (PARTITION BY s ORDER BY k) "
            "ORDER BY k",
            None,
        ),
        # list functions of the metric view (histogram buckets) and the busy-interval read
        ("SELECT list_sum([2, 3]), coalesce(list_position(['b', 'a'], s), 0) FROM t ORDER BY k", None),
        # sorted lists per group (the busy intervals on ClickHouse; non-NULL values only)
        ("SELECT s, list_sort(list(k * 7 % 5)) FROM t WHERE s IS NOT NULL GROUP BY s ORDER BY s", None),
    ],
)
def test_the_same_query_answers_alike(engines: tuple[Any, Any], query: str, parameters: list[Any] | None) -> None:
    duck, house = engines
    expected = duck.execute(query, parameters).fetchall()
    got = house.execute(query, parameters).fetchall()
    assert _same(got, expected), (got, expected, house.translate(query, parameters))


def test_an_aggregated_condition_is_a_boolean_column_too(engines: tuple[Any, Any]) -> None:
    # bool_or of a condition, also under FILTER and in coalesce: ClickHouse's max/maxIf give UInt8,
    # and polars will not AND a UInt8 with a boolean (the retry rule failed so on chdb, 1340103).
    duck, house = engines
    query = (
        "SELECT s, coalesce(bool_or(x > 2) FILTER (WHERE k > 1), false) AS any_big, bool_and(x > 0) AS all_pos "
        "FROM t WHERE s IS NOT NULL GROUP BY s ORDER BY s"
    )
    expected, got = duck.sql(query).pl(), house.sql(query).pl()
    assert got.schema == expected.schema, (got.schema, house.translate(query, None))
    assert got.rows() == expected.rows()


def _maps(house: Any) -> None:
    string_map = pa.map_(pa.string(), pa.string())
    house.register(
        "m",
        pa.table({"attributes": pa.array([[("a", "x"), ("b", "y")]], string_map),
                  "extra_attributes": pa.array([[("b", "y")]], string_map)}),
    )  # fmt: skip


def test_a_map_lookup_of_an_absent_key_is_null(engines: tuple[Any, Any]) -> None:
    _, house = engines
    _maps(house)
    rows = house.execute("SELECT extra_attributes['missing'] IS NULL, attributes['a'] FROM m").fetchall()
    assert rows == [(True, "x")]


def test_map_entries_unnest_as_key_value_rows(engines: tuple[Any, Any]) -> None:
    _, house = engines
    _maps(house)
    rows = house.execute(
        "SELECT key, value FROM (SELECT unnest(map_entries(attributes), recursive := true) FROM m) ORDER BY key"
    ).fetchall()
    assert rows == [("a", "x"), ("b", "y")]


def test_fetchnumpy_masks_nulls_as_duckdb_does(engines: tuple[Any, Any]) -> None:
    duck, house = engines
    expected = duck.sql("SELECT x FROM t ORDER BY k").fetchnumpy()["x"]
    got = house.sql("SELECT x FROM t ORDER BY k").fetchnumpy()["x"]
    assert list(got.mask) == list(expected.mask) == [False, False, True, False, False, False]
    assert [float(v) for v in got.compressed()] == [float(v) for v in expected.compressed()]


def test_a_refused_query_is_a_short_store_error(engines: tuple[Any, Any]) -> None:
    _, house = engines
    with pytest.raises(StoreError, match="ClickHouse") as caught:
        house.execute("SELECT no_such_column FROM t")
    assert len(str(caught.value)) <= 420


def test_parameters_must_match_the_placeholders(engines: tuple[Any, Any]) -> None:
    _, house = engines
    with pytest.raises(StoreError, match="2 parameters, 1 given"):
        house.execute("SELECT ? + ?", [1])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    q=st.floats(0.0, 1.0),
)
# Where n q is a whole number ClickHouse's quantileExactLow takes the next order statistic
# (found by this test: 1/3 of three values); 0.7 of ten is the 7th value for DuckDB's exact
# DECIMAL literal, the 8th by the double 10 * 0.7; 1e-05 is a DOUBLE literal.
@example(values=[0.0, 1.0, -1.0], q=0.3333333333333333)
@example(values=[float(v) for v in range(10)], q=0.7)
@example(values=[float(v) for v in range(100_000 // 1000)], q=1e-05)
def test_quantiles_agree_with_duckdb_on_any_sample(engines: tuple[Any, Any], values: list[float], q: float) -> None:
    duck, house = engines
    table = pa.table({"v": pa.array(values, pa.float64())})
    duck.register("sample", table)
    house.register("sample", table)
    query = f"SELECT quantile_cont(v, {q!r}), quantile_disc(v, {q!r}) FROM sample"
    expected = duck.execute(query).fetchall()[0]
    got = house.execute(query).fetchall()[0]
    # The same interpolation, its rounding aside: between two order statistics the two engines
    # may differ in the last bits of the operands' scale (e.g. 0.012156 of [0, 12156] at q=1e-6).
    scale = max(abs(v) for v in values)
    assert all(math.isclose(g, e, rel_tol=1e-12, abs_tol=1e-12 * scale) for g, e in zip(got, expected, strict=True)), (
        values,
        q,
        got,
        expected,
    )


def test_several_discrete_quantiles_and_none_of_nothing_agree_with_duckdb(engines: tuple[Any, Any]) -> None:
    duck, house = engines
    for values in ([float(v) for v in range(12)], []):
        table = pa.table({"v": pa.array(values, pa.float64())})
        duck.register("sample", table)
        house.register("sample", table)
        query = (
            "SELECT quantile_disc(v, [0.25, 0.5, 0.7, 1.0]), quantile_disc(v, 0.5), quantile_cont(v, 0.5) FROM sample"
        )
        assert house.execute(query).fetchall() == duck.execute(query).fetchall()


class ChdbClient:
    """A stand-in for clickhouse-connect's client, answered by chdb (no ClickHouse server can run here:
    Debian's package is from 2018 and nothing else installs one). It returns String columns as
    binary, as the real client does for a user who may not change output settings."""

    def __init__(self, *, apply_settings: bool, **kwargs: Any) -> None:
        from chdb import session

        self.kwargs = kwargs
        self.db = session.Session()
        for name, value in (kwargs.get("settings") or {}).items() if apply_settings else ():
            self.db.query(f"SET {name} = {value}")

    def query_arrow(self, query: str) -> pa.Table:
        table: pa.Table = self.db.query(query, "ArrowTable")
        for i, field in enumerate(table.schema):
            if pa.types.is_string(field.type):
                table = table.set_column(i, field.name, table.column(i).cast(pa.binary()))
        return table

    def command(self, query: str) -> None:
        self.db.query(query)

    def insert_arrow(self, name: str, table: pa.Table) -> None:
        import tempfile

        import pyarrow.parquet as pq

        with tempfile.TemporaryDirectory() as scratch:
            pq.write_table(table, f"{scratch}/rows.parquet")
            self.db.query(f"INSERT INTO `{name}` SELECT * FROM file('{scratch}/rows.parquet', Parquet)")

    def close(self) -> None:
        self.db.close()


def test_a_server_url_reaches_the_client_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    import clickhouse_connect

    from sre_agent.store.clickhouse import SETTINGS, connect_clickhouse

    made: list[ChdbClient] = []

    def get_client(**kwargs: Any) -> ChdbClient:
        made.append(ChdbClient(apply_settings=True, **kwargs))
        return made[-1]

    monkeypatch.setattr(clickhouse_connect, "get_client", get_client)
    house = connect_clickhouse("clickhouses://reader:s%40cret@ch.example:8443/otel")
    try:
        assert made[0].kwargs == {"host": "ch.example", "port": 8443, "username": "reader", "password": "s@cret",
                                  "database": "otel", "secure": True, "settings": SETTINGS}  # fmt: skip
        house.register("t", ROWS)
        # Strings come back as strings, and a registered frame is queryable, through the client's calls.
        assert house.execute("SELECT s, count(*) FROM t WHERE s IS NOT NULL GROUP BY s ORDER BY s").fetchall() == [
            ("a", 2), ("b", 2), ("c", 1)
        ]  # fmt: skip
    finally:
        house.close()


def test_a_session_without_duckdbs_null_semantics_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import clickhouse_connect

    from sre_agent.store.clickhouse import connect_clickhouse

    monkeypatch.setattr(clickhouse_connect, "get_client", lambda **kw: ChdbClient(apply_settings=False, **kw))
    with pytest.raises(StoreError, match=r"join_use_nulls=0.*readonly=2"):
        connect_clickhouse("clickhouse://reader@ch.example:8123/otel")


def test_metric_sources_cover_every_name_that_reads_as_the_canonical_one() -> None:
    from sre_agent.store.clickhouse_schema import metric_sources
    from sre_agent.store.schema import METRIC_NAME_ALIASES, canonical_metric_name

    old, new = next(iter(METRIC_NAME_ALIASES.items()))
    exported = [old, old + "_total", new, new + "_total", "vllm:num_requests_running", "other_total", "x_total_total"]
    for wanted in (new, old, "vllm:num_requests_running", "other", "x_total", "absent"):
        sources = metric_sources(frozenset({wanted}))
        reads_as = {m for m in exported if canonical_metric_name(m) == wanted}
        assert reads_as <= sources, (wanted, reads_as, sources)
    assert old not in metric_sources(frozenset({old}))  # an old name is mapped away: nothing reads as it


def test_a_metric_name_filter_narrows_the_exporter_scan() -> None:
    """``name = ...`` reaches the exporter's tables as ``MetricName IN (...)`` (its ORDER BY key).

    That the answers stay the same is the engine-parity suite's (tests/diagnose/test_diagnose_engines.py).
    """
    from sre_agent.store.clickhouse import connect_clickhouse

    house = connect_clickhouse("chdb:")
    try:
        narrowed = house.translate(
            "SELECT count(*) FROM metric_points m WHERE (m.name = 'a' AND time_ns > 0) OR name IN ('b', 'c')"
        )[-1]
        assert "MetricName IN ('a', 'a_total', 'b', 'b_total', 'c', 'c_total')" in narrowed
        assert (
            "MetricName IN ('d', 'd_total')" in house.translate("SELECT 1 FROM metric_points WHERE name = ?", ["d"])[-1]
        )
        for query in (
            "SELECT count(*) FROM metric_points WHERE name = 'a' OR time_ns > 0",  # not every row needs a name
            "SELECT count(*) FROM metric_points m JOIN spans s ON TRUE WHERE m.name = 'a'",  # two sources
            "SELECT count(*) FROM metric_points m WHERE other.name = 'a'",  # another relation's column
        ):
            assert "MetricName IN" not in house.translate(query)[-1]
    finally:
        house.close()
