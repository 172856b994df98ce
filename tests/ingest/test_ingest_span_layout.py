"""The stored span layout (issue 18): promoted attributes are stored once, and nothing reads differently.

``span_rows`` leaves an attribute out of its maps when a canonical column
spells it back exactly; the ``spans`` view puts it back. These tests check
that a reader of ``spans`` gets every map exactly as decoded (on random
attributes, through a real store file), that the query code's one-key
lookups agree with the rebuilt maps, that a schema-1 store migrates on open
without losing or rewriting a row, and the spelling fact the layout rests on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_builders import T0, VLLM_V1, trace_request

from sre_agent.analysis.attribute_keys import _DIMENSION_COLUMNS, key_sql
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_traces
from sre_agent.store import schema
from sre_agent.store.embedded import SCHEMA_VERSION, Store
from sre_agent.store.span_rows import safe_doubles, to_span_rows

NORM = Normaliser(hash_key=b"layout")
PROMOTED = [key for key, _ in schema.PROMOTED_KEYS]
SCHEMA_1_SPANS_DDL = (
    "CREATE TABLE spans (\n    " + ",\n    ".join(f"{c.name} {c.duckdb}" for c in schema.SPAN_COLUMNS) + "\n)"
)


def _decode(request: Any) -> pa.Table:
    return decode_traces(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table


def _maps(con: duckdb.DuckDBPyConnection) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    rows = con.execute("SELECT span_id, attributes, resource_attributes FROM spans ORDER BY span_id").fetchall()
    return [(span_id, dict(attrs or {}), dict(resource or {})) for span_id, attrs, resource in rows]


def _expected(table: pa.Table) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    rows = zip(
        table.column("span_id").to_pylist(),
        table.column("attributes").to_pylist(),
        table.column("resource_attributes").to_pylist(),
        strict=True,
    )
    return sorted((span_id, dict(attrs or []), dict(resource or [])) for span_id, attrs, resource in rows)


def test_vllm_spans_store_their_promoted_attributes_once(tmp_path: Path) -> None:
    spans = [{"attributes": {**VLLM_V1, "gen_ai.request.id": f"r-{i}"}, "start": T0 + i} for i in range(50)]
    decoded = _decode(trace_request(spans, resource={"service.name": "vllm", "service.version": "v1"}))
    with Store.open(tmp_path / "s.duckdb") as store:
        assert store.append_spans(decoded) == 50
        stored = store.connection.execute(
            "SELECT list_sort(map_keys(extra_attributes)), map_keys(extra_resource_attributes), promoted "
            "FROM span_rows LIMIT 1"
        ).fetchone()
        assert _maps(store.connection) == _expected(decoded)
    assert stored is not None
    kept, kept_resource, bits = stored
    # Only what no column reproduces stays in the stored maps (max_tokens has its column since schema 3).
    promoted_away = {"gen_ai.request.id", "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"}
    assert not set(kept) & (promoted_away | {"gen_ai.request.max_tokens"})
    assert kept_resource == []
    assert bits != 0


# Values for promoted keys that round-trip through their column, and values that must not be
# dropped: integral or tiny doubles (spelled differently by DuckDB), strings that only parse as
# the column's number, and an int sent for a string column.
_VALUES = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.floats(min_value=1e-4, max_value=1e3),
    st.sampled_from(["stop", "length", "0.5", "007", "12", "", "ünï", "v1", "gpu-1", " 3"]),
    st.booleans(),
)
_KEYS = st.one_of(st.sampled_from(PROMOTED), st.sampled_from(["note", "http.route", "tenant"]))
_ATTRIBUTES = st.dictionaries(_KEYS, _VALUES, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spans=st.lists(_ATTRIBUTES, min_size=1, max_size=12), resource=_ATTRIBUTES)
def test_every_map_reads_back_exactly_as_decoded(
    tmp_path_factory: pytest.TempPathFactory, spans: Any, resource: Any
) -> None:
    request = trace_request([{"attributes": a, "start": T0 + i} for i, a in enumerate(spans)], resource=resource)
    decoded = _decode(request)
    path = tmp_path_factory.mktemp("layout") / "s.duckdb"
    with Store.open(path) as store:
        store.append_spans(decoded)
        assert _maps(store.connection) == _expected(decoded)
        # The query code's one-key spelling gives what a lookup in the rebuilt maps gives.
        # (Keys named like a canonical or dimension column, e.g. service.name, read it by design.)
        for key in {*PROMOTED, "note", "http.route"} - set(_DIMENSION_COLUMNS) - {c.name for c in schema.SPAN_COLUMNS}:
            fast = key_sql(key)
            column = dict(schema.PROMOTED_KEYS).get(key)
            slow = f"coalesce(attributes['{key}'], resource_attributes['{key}']"
            slow += f", CAST({column} AS VARCHAR))" if column else ")"
            got = store.connection.execute(f"SELECT span_id, {fast}, {slow} FROM spans").fetchall()
            assert [row[1] for row in got] == [row[2] for row in got], key


def test_a_schema_1_store_migrates_on_open_without_losing_a_row(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    spans = [{"attributes": {**VLLM_V1, "gen_ai.request.id": f"r-{i}"}, "start": T0 + i} for i in range(20)]
    decoded = _decode(trace_request(spans, resource={"service.name": "vllm", "service.version": "v1"}))
    con = duckdb.connect(str(path))
    con.execute(SCHEMA_1_SPANS_DDL)
    con.execute(schema.METRIC_POINTS_DDL)
    con.execute(schema.DEPLOYS_DDL)
    con.register("batch", decoded)
    con.execute("INSERT INTO spans SELECT * FROM batch")
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
    con.execute("INSERT INTO meta VALUES ('schema_version', '1'), ('hash_key', '00')")
    con.close()

    # A read-only open (what diagnose does) upgrades in place first: it rewrites no row.
    with Store.open(path, read_only=True) as store:
        assert _maps(store.connection) == _expected(decoded)
        promoted = store.connection.execute("SELECT DISTINCT promoted FROM span_rows").fetchall()
        version = store.connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert promoted == [(0,)]  # old rows keep their whole maps
    assert version == (SCHEMA_VERSION,)
    more = _decode(trace_request([{"attributes": VLLM_V1, "start": T0 + 100}], resource={"service.name": "vllm"}))
    with Store.open(path) as store:
        assert store.append_spans(decoded) == 0  # the duplicate check sees the migrated rows
        assert store.append_spans(more) == 1
        assert len(_maps(store.connection)) == 21
        assert _maps(store.connection) == sorted(_expected(decoded) + _expected(more))


_SCHEMA_3_KEYS = {
    "gen_ai.request.max_tokens",
    "gen_ai.request.temperature",
    "gen_ai.request.top_p",
    "gen_ai.request.choice.count",
    "gen_ai.request.n",
}


def _schema_2_file(path: Path, decoded: pa.Table, *, meta: bool = True) -> None:
    """A store as schema 2 wrote it: no request-parameter columns, resource bits at 32 + index in ``promoted``."""
    rows = to_span_rows(decoded)
    old_bits = pc.bit_wise_or(rows["promoted"], pc.shift_left(rows["promoted_resource"], pa.scalar(32, pa.int64())))
    new_columns = ["max_tokens", "temperature", "top_p", "choice_count", "promoted_resource"]
    rows = rows.drop_columns(new_columns)
    rows = rows.set_column(rows.schema.get_field_index("promoted"), "promoted", old_bits)
    con = duckdb.connect(str(path))
    con.execute(schema.SPAN_ROWS_DDL)
    for column in new_columns:
        con.execute(f"ALTER TABLE span_rows DROP COLUMN {column}")
    con.execute(schema.METRIC_POINTS_DDL)
    con.execute(schema.DEPLOYS_DDL)
    if meta:
        con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
        con.execute("INSERT INTO meta VALUES ('schema_version', '2'), ('hash_key', '00')")
    con.register("rows", rows)
    con.execute("INSERT INTO span_rows BY NAME SELECT * FROM rows")
    con.close()


def test_a_schema_2_store_moves_its_resource_bits_on_open_and_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "schema2.duckdb"
    attributes = {k: v for k, v in VLLM_V1.items() if k not in _SCHEMA_3_KEYS}  # what schema 2 could promote
    spans = [{"attributes": {**attributes, "gen_ai.request.id": f"r-{i}"}, "start": T0 + i} for i in range(20)]
    resource = {"service.name": "vllm", "service.version": "v1", "host.name": "gpu-1"}
    decoded = _decode(trace_request(spans, resource=resource))
    _schema_2_file(path, decoded)
    with Store.open(path, read_only=True) as store:  # upgrades in place first, as diagnose's open does
        assert _maps(store.connection) == _expected(decoded)
        bits = store.connection.execute("SELECT DISTINCT promoted, promoted_resource FROM span_rows").fetchall()
        version = store.connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert version == (SCHEMA_VERSION,)
    assert bits
    assert all(0 < span < 2**32 and resource_bits > 0 for span, resource_bits in bits)
    more = _decode(trace_request([{"attributes": VLLM_V1, "start": T0 + 100}], resource=resource))
    with Store.open(path) as store:
        assert store.append_spans(decoded) == 0
        assert store.append_spans(more) == 1
        assert _maps(store.connection) == sorted(_expected(decoded) + _expected(more))
        caps = store.connection.execute("SELECT max_tokens FROM spans ORDER BY start_ns").fetchall()
    assert caps == [(None,)] * 20 + [(VLLM_V1["gen_ai.request.max_tokens"],)]  # old rows: still in their maps


def test_a_schema_2_file_without_a_meta_table_migrates_too(tmp_path: Path) -> None:
    # The console benchmark's store is built by DuckDB alone: no meta table. The first version of
    # the schema-3 migration failed on it, and the console showed no figures.
    path = tmp_path / "bare2.duckdb"
    attributes = {k: v for k, v in VLLM_V1.items() if k not in _SCHEMA_3_KEYS}  # what schema 2 could promote
    decoded = _decode(trace_request([{"attributes": attributes}], resource={"service.name": "vllm"}))
    _schema_2_file(path, decoded, meta=False)
    with Store.open(path, read_only=True) as store:
        assert _maps(store.connection) == _expected(decoded)


def test_a_schema_1_file_without_a_meta_table_migrates_too(tmp_path: Path) -> None:
    # Files built by DuckDB alone (the console benchmark's, users' own) carry no meta table; the
    # first version of the migration failed on them, and the console then showed no figures.
    path = tmp_path / "bare.duckdb"
    decoded = _decode(trace_request([{"attributes": VLLM_V1}], resource={"service.name": "vllm"}))
    con = duckdb.connect(str(path))
    for ddl in (SCHEMA_1_SPANS_DDL, schema.METRIC_POINTS_DDL, schema.DEPLOYS_DDL):
        con.execute(ddl)
    con.register("batch", decoded)
    con.execute("INSERT INTO spans SELECT * FROM batch")
    con.close()
    with Store.open(path, read_only=True) as store:
        assert _maps(store.connection) == _expected(decoded)


def test_arrow_and_the_view_spell_the_doubles_the_layout_drops_alike() -> None:
    # The layout drops a double attribute only where Arrow's spelling (ingest's) is the view's
    # (promoted_sql): non-integral with 1e-4 <= |x| < 1e9, and integral with |x| < 1e9 but -0.
    # Checked here on 3 million values, so an Arrow or DuckDB release that spells them
    # differently fails this test, not a user's query.
    rng = np.random.default_rng(7)
    exponents = rng.uniform(-4, 9, 1_000_000)
    fractions = np.concatenate([10.0**exponents, -(10.0**exponents) * rng.random(1_000_000)])
    integers = np.trunc(fractions[:1_000_000] * rng.choice([-1.0, 1.0], 1_000_000))
    values = np.concatenate([fractions, integers, [0.0, 1.0, -1.0, 999_999_999.0, -0.0, 1e9, 3e-05]])
    safe = safe_doubles(values)
    assert not safe[-3:].any()  # -0, 1e9 and 3e-05 stay in the map
    values = values[safe]
    assert values.size > 2_500_000
    assert (values == np.trunc(values)).sum() > 500_000
    arrow = pc.cast(pa.array(values), pa.string())
    con = duckdb.connect()
    con.execute("CREATE TABLE doubles (e2e_s DOUBLE)")
    con.register("values_in", pa.table({"e2e_s": values}))
    con.execute("INSERT INTO doubles SELECT * FROM values_in")
    index = [column for _, column in schema.PROMOTED_KEYS].index("e2e_s")
    _, spelling = schema.promoted_sql(index, "promoted")
    spelled = con.execute(f"SELECT {spelling} AS s FROM doubles").fetchnumpy()["s"]
    assert (arrow.to_numpy(zero_copy_only=False) == np.asarray(spelled)).all()


@pytest.mark.parametrize("value", [-0.0, 3e-05, 1e9 + 0.5, 1e9, -2e9])
def test_doubles_outside_that_range_stay_in_the_map(value: float) -> None:
    decoded = _decode(trace_request([{"attributes": {"gen_ai.latency.e2e": value}}]))
    rows = to_span_rows(decoded)
    assert rows.column("extra_attributes").to_pylist()[0] == decoded.column("attributes").to_pylist()[0]
    assert rows.column("promoted").to_pylist()[0] == 0  # (the resource's service.name is dropped, rightly)


def test_a_token_count_beyond_2_to_the_53_decodes() -> None:
    # Found by the property test above: the TPOT division cast such a count to float "safely" and
    # failed the whole batch with ArrowInvalid instead of storing the span.
    decoded = _decode(trace_request([{"attributes": {"gen_ai.usage.output_tokens": 9007199254740994.0}}]))
    assert decoded.column("output_tokens").to_pylist() == [9007199254740994]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.0, 1.0), (0.7, 0.95)])
def test_vllm_sampling_parameters_leave_nothing_in_the_map(tmp_path: Path, temperature: float, top_p: float) -> None:
    """vLLM V1 sets max_tokens, temperature, top_p and n on every span; its defaults (1.0, greedy 0.0)
    are integral doubles, which the view spells as Arrow does, so they are stored once too."""
    attributes = {
        **VLLM_V1,
        "gen_ai.request.temperature": temperature,
        "gen_ai.request.top_p": top_p,
        "gen_ai.request.n": 1,
    }
    decoded = _decode(trace_request([{"attributes": attributes}], resource={"service.name": "vllm"}))
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append_spans(decoded)
        kept = store.connection.execute("SELECT map_keys(extra_attributes) FROM span_rows").fetchone()
        row = store.connection.execute("SELECT temperature, top_p, choice_count FROM spans").fetchone()
        assert _maps(store.connection) == _expected(decoded)
    assert kept is not None
    assert not set(kept[0]) & _SCHEMA_3_KEYS
    assert row == (temperature, top_p, 1)
