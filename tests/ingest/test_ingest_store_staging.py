"""Large appends of attribute-heavy rows go through a Parquet staging file: same rows as the Arrow scan,
no leftovers. Most tests here stage whatever the rows hold (``_always_stage``); the last checks the choice."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from otlp_builders import T0, VLLM_V1, metrics_request, trace_request

import sre_agent.store.embedded as store_module
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_metrics, decode_traces
from sre_agent.store.embedded import Store

NORM = Normaliser(hash_key=b"k")
SECOND = 1_000_000_000


def _spans(n: int) -> pa.Table:
    """``n`` spans (more than the staging threshold) with varied attributes, some with odd values."""
    spans = []
    for i in range(n):
        attributes = dict(VLLM_V1)
        attributes["gen_ai.request.id"] = f"req-{i}"
        if i % 3 == 0:
            attributes["tenant.id"] = f"tenant-{i % 7}"
        if i % 5 == 0:
            attributes["note"] = "ünïcode ✓ " * (i % 4)
        if i % 11 == 0:
            attributes = {}  # an empty MAP, not NULL
        spans.append({"attributes": attributes, "start": T0 + i * SECOND})
    request = trace_request(spans, resource={"service.name": "vllm", "service.version": "v1"})
    return decode_traces(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table


@pytest.fixture(autouse=True)
def _always_stage(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if "staging_choice" not in request.node.name:
        monkeypatch.setattr(store_module, "_STAGE_MIN_MAP_ENTRIES_PER_ROW", 0)


def _rows(store: Store) -> list[tuple[object, ...]]:
    return store.connection.execute("SELECT * FROM spans ORDER BY span_id").fetchall()


def test_staged_append_stores_exactly_what_the_arrow_scan_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = _spans(300)
    assert batch.num_rows >= store_module._STAGE_MIN_ROWS
    with Store.open(tmp_path / "staged.duckdb") as staged:
        assert staged.append_spans(batch) == 300
        assert staged.append_spans(batch) == 0  # idempotent through the staged path too
        staged_rows = _rows(staged)
        query = "SELECT typeof(attributes), typeof(resource_attributes) FROM spans"
        types = staged.connection.execute(query).fetchone()
        attributes = [row[0] for row in staged.connection.execute("SELECT attributes FROM spans").fetchall()]
    monkeypatch.setattr(store_module, "_STAGE_MIN_ROWS", 10**9)
    with Store.open(tmp_path / "arrow.duckdb") as direct:
        assert direct.append_spans(batch) == 300
        assert _rows(direct) == staged_rows
    assert types == ("MAP(VARCHAR, VARCHAR)", "MAP(VARCHAR, VARCHAR)")
    empty = [value for value in attributes if value == {}]
    assert len(empty) == len(range(0, 300, 11))


def test_staging_files_are_removed_after_each_append_and_the_folder_on_close(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store.duckdb") as store:
        store.append_spans(_spans(100))
        folder = store._stage_dir
        assert folder is not None
        assert os.path.isdir(folder)
        assert os.listdir(folder) == []
    assert not os.path.exists(folder)


def test_unwritable_staging_folder_falls_back_to_the_arrow_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(store_module, "_stage_parent", lambda: str(tmp_path / "missing" / "dir"))
    with (
        caplog.at_level(logging.WARNING, logger="sre_agent.store.embedded"),
        Store.open(tmp_path / "store.duckdb") as store,
    ):
        assert store.append_spans(_spans(100)) == 100
        row = store.connection.execute("SELECT count(*) FROM spans").fetchone()
    assert row == (100,)
    assert "appending through Arrow" in caplog.text


def test_staging_folders_of_dead_processes_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_stage_parent", lambda: str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    stale = tmp_path / f"sre-agent-stage-{int(dead.stdout)}-abc"
    stale.mkdir()
    (stale / "spans.parquet").write_bytes(b"left by a killed writer")
    alive = tmp_path / f"sre-agent-stage-{os.getppid()}-def"  # our parent: a live process
    alive.mkdir()
    unrelated = tmp_path / "something-else"
    unrelated.mkdir()
    with Store.open(tmp_path / "store.duckdb") as store:
        assert store.append_spans(_spans(100)) == 100
        assert store._stage_dir is not None
        assert Path(store._stage_dir).name.startswith(f"sre-agent-stage-{os.getpid()}-")
    assert not stale.exists()
    assert alive.exists()
    assert unrelated.exists()


def test_staged_metric_points_match_the_arrow_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gauge = [{"time": T0 + i, "value": i * 0.5, "attributes": {"model_name": f"m{i % 3}"}} for i in range(80)]
    histogram = [
        {"time": T0 + i, "count": 3, "sum": 1.5, "bounds": [0.1, 1.0], "bucket_counts": [1, 1, 1]} for i in range(80)
    ]
    request = metrics_request(
        [
            {"name": "vllm:num_requests_running", "kind": "gauge", "points": gauge},
            {"name": "vllm:e2e_request_latency_seconds", "kind": "histogram", "points": histogram},
        ]
    )
    table = decode_metrics(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table
    query = "SELECT * FROM metric_points ORDER BY series_key, time_ns"
    with Store.open(tmp_path / "staged.duckdb") as staged:
        assert staged.append_metric_points(table) == 160
        assert staged._stage_dir is not None
        staged_rows = staged.connection.execute(query).fetchall()
    monkeypatch.setattr(store_module, "_STAGE_MIN_ROWS", 10**9)
    with Store.open(tmp_path / "arrow.duckdb") as direct:
        assert direct.append_metric_points(table) == 160
        assert direct.connection.execute(query).fetchall() == staged_rows


def test_staging_choice_follows_how_many_map_entries_a_row_holds(tmp_path: Path) -> None:
    """Rows with a few MAP entries (an engine span in ``span_rows`` keeps ~1) are cheaper through the
    Arrow scan; attribute-heavy rows (a gateway span with dozens of attributes) through Parquet."""
    narrow = _spans(300)
    extra = {f"http.extra.{j}": f"v{j}" for j in range(store_module._STAGE_MIN_MAP_ENTRIES_PER_ROW + 2)}
    heavy = [{"attributes": {**extra, "n": i}, "start": T0 + i * SECOND} for i in range(300)]
    request = trace_request(heavy, resource={"service.name": "gateway"})
    wide = decode_traces(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table
    with Store.open(tmp_path / "narrow.duckdb") as store:
        assert store.append_spans(narrow) == 300
        assert store._stage_dir is None  # no staging folder was ever needed
    with Store.open(tmp_path / "wide.duckdb") as store:
        assert store.append_spans(wide) == 300
        assert store._stage_dir is not None
        assert store.connection.execute("SELECT attributes['http.extra.0'] FROM spans LIMIT 1").fetchone() == ("v0",)
