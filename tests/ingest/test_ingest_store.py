"""The DuckDB store: idempotent appends, deploys, retention, locking, read-only."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from otlp_builders import T0, VLLM_V1, trace_request

from sre_agent.errors import StoreError, StoreLockedError
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_traces
from sre_agent.store.embedded import Deploy, Store

NORM = Normaliser(hash_key=b"k")
SECOND = 1_000_000_000


def _spans(n: int, *, start: int = T0, service: str = "vllm", version: str | None = "v1") -> pa.Table:
    resource = {"service.name": service}
    if version is not None:
        resource["service.version"] = version
    request = trace_request([{"attributes": VLLM_V1, "start": start + i * SECOND} for i in range(n)], resource=resource)
    return decode_traces(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    with Store.open(tmp_path / "store.duckdb") as opened:
        yield opened


def _count(store: Store) -> int:
    row = store.connection.execute("SELECT count(*) FROM spans").fetchone()
    assert row is not None
    return int(row[0])


def test_same_batch_twice_stores_once(store: Store) -> None:
    batch = _spans(50)
    assert store.append_spans(batch) == 50
    assert store.append_spans(batch) == 0
    assert store.append_spans(batch.slice(10, 5)) == 0
    assert _count(store) == 50


def test_duplicates_within_one_batch_and_partial_overlap(store: Store) -> None:
    batch = _spans(20)
    assert store.append_spans(pa.concat_tables([batch, batch.slice(0, 5)])) == 20
    more = pa.concat_tables([batch.slice(15, 5), _spans(7, start=T0 + 3600 * SECOND)])
    assert store.append_spans(more) == 7
    assert _count(store) == 27


def test_a_key_repeated_in_a_batch_keeps_its_first_row_even_across_a_wide_time_range(store: Store) -> None:
    old = _spans(3)
    assert store.append_spans(old) == 3
    later = _spans(4, start=T0 + 86_400 * SECOND)
    renamed = later.slice(1, 1).set_column(later.schema.get_field_index("name"), "name", pa.array(["second copy"]))
    # A straggler from a day before makes the batch's time range span the whole table.
    batch = pa.concat_tables([later, renamed, old.slice(2, 1)])
    assert store.append_spans(batch) == 4
    names = store.connection.execute("SELECT DISTINCT name FROM spans").fetchall()
    assert names == [("llm_request",)]
    assert _count(store) == 7


def test_rows_are_kept_in_time_order_within_a_batch(store: Store) -> None:
    batch = _spans(30)
    store.append_spans(batch.take(list(reversed(range(30)))))
    starts = [r[0] for r in store.connection.execute("SELECT start_ns FROM spans").fetchall()]
    assert starts == sorted(starts)


def test_metric_points_idempotent(store: Store) -> None:
    from otlp_builders import metrics_request

    from sre_agent.ingest.otlp import decode_metrics

    request = metrics_request(
        [{"name": "g", "kind": "gauge", "points": [{"time": T0 + i, "value": 1.0} for i in range(9)]}]
    )
    table = decode_metrics(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table
    assert store.append_metric_points(table) == 9
    assert store.append_metric_points(table) == 0
    assert store.counts()["metric_points"] == 9


def test_new_service_version_is_an_auto_deploy(store: Store) -> None:
    store.append_spans(_spans(5, version="v1"))
    assert store.deploys() == []  # the first version seen is not a deploy
    store.append_spans(_spans(5, start=T0 + 100 * SECOND, version="v2"))
    store.append_spans(_spans(5, start=T0 + 200 * SECOND, version="v2"))
    store.append_spans(_spans(5, start=T0 + 50 * SECOND, service="other", version="x1"))
    assert store.deploys() == [Deploy(T0 + 100 * SECOND, "vllm", "v2", "v1", "auto", None)]
    assert store.deploys("other") == []


def test_out_of_order_files_still_give_the_right_deploy(store: Store) -> None:
    store.append_spans(_spans(3, start=T0 + 500 * SECOND, version="v2"))
    store.append_spans(_spans(3, start=T0, version="v1"))
    assert store.deploys() == [Deploy(T0 + 500 * SECOND, "vllm", "v2", "v1", "auto", None)]


def test_deploys_survive_reopen_and_explicit_marks(tmp_path: Path) -> None:
    path = tmp_path / "d.duckdb"
    with Store.open(path) as store:
        store.append_spans(_spans(2, version="v1"))
        mark = store.mark_deploy("vllm", "v9", T0 + 10 * SECOND, note="manual rollout")
        assert mark.previous_version == "v1"
    with Store.open(path) as store:
        store.append_spans(_spans(2, start=T0 + 20 * SECOND, version="v3"))
        deploys = store.deploys("vllm")
    assert [(d.version, d.previous_version, d.source, d.note) for d in deploys] == [
        ("v9", "v1", "mark", "manual rollout"),
        ("v3", "v1", "auto", None),
    ]


def test_old_data_is_kept_until_retention_is_applied(store: Store) -> None:
    ancient = T0 - 400 * 24 * 3600 * SECOND
    store.append_spans(_spans(4, start=ancient))
    store.append_spans(_spans(6, start=T0))
    assert _count(store) == 10  # nothing dropped at ingest
    deleted = store.apply_retention(30 * 24 * 3600, now_ns=T0 + 3600 * SECOND)
    assert deleted == 4
    assert _count(store) == 6


def test_locked_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "locked.duckdb"
    Store.open(path).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from sre_agent.store.embedded import Store\n"
            f"s = Store.open({str(path)!r})\nprint('ready', flush=True)\ninput()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError, match="--url") as info:
            Store.open(path)
        assert str(path) in str(info.value)
        with pytest.raises(StoreLockedError):
            Store.open(path, read_only=True)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()


def test_read_only(tmp_path: Path) -> None:
    path = tmp_path / "ro.duckdb"
    with Store.open(path) as store:
        store.append_spans(_spans(3))
        key = store.hash_key
    with Store.open(path, read_only=True) as ro:
        assert ro.counts()["spans"] == 3
        assert ro.hash_key == key
        with pytest.raises(StoreError, match="read-only"):
            ro.append_spans(_spans(1))


def test_read_only_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here.duckdb"
    with pytest.raises(StoreError, match="no store at"):
        Store.open(missing, read_only=True)
    assert not missing.exists()


def test_cursor_reads_from_another_thread_and_close_is_idempotent(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "t.duckdb")
    store.append_spans(_spans(8))
    seen: list[int] = []

    def read() -> None:
        row = store.cursor().execute("SELECT count(*) FROM spans").fetchone()
        seen.append(int(row[0]) if row else -1)

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    assert seen == [8]
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.append_spans(_spans(1))


def test_a_writable_store_checkpoints_late_and_a_killed_writers_log_replays(tmp_path: Path) -> None:
    """DuckDB's 16 MB default made checkpoints most of a busy writer's time (store.CHECKPOINT_THRESHOLD);
    what stays in the log instead must come back when a killed writer's file is opened again."""
    path = tmp_path / "store.duckdb"
    with Store.open(path) as store:
        threshold = store.connection.execute("SELECT current_setting('checkpoint_threshold')").fetchone()
        assert threshold is not None
        assert threshold[0].endswith("MiB")
        assert float(threshold[0].split()[0]) >= 244  # 256 MB
    script = (
        "import os, sys; sys.path.insert(0, sys.argv[2]); from test_ingest_store import _spans; "
        "from sre_agent.store.embedded import Store; s = Store.open(sys.argv[1]); "
        "s.append_spans(_spans(500)); os._exit(0)"
    )
    folder = str(Path(__file__).parent)
    killed = tmp_path / "killed.duckdb"
    subprocess.run([sys.executable, "-c", script, str(killed), folder], check=True, cwd=folder)
    assert (tmp_path / "killed.duckdb.wal").exists()  # nothing was checkpointed before the exit
    with Store.open(killed, read_only=True) as store:
        assert _count(store) == 500
