"""`sre-agent serve` as a command: exit codes (CONTRACTS 2), help, locked store, and the
Writer's queue semantics in-process (ack after commit, bounded queue, flush on close)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from receiver_harness import free_port, start_serve, vllm_request

from sre_agent.errors import OverloadedError, StoreError
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_traces
from sre_agent.ingest.receiver import Writer
from sre_agent.store.embedded import Store


def _run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SRE_AGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "sre_agent", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
    )


def test_help_ends_with_an_example(tmp_path: Path) -> None:
    result = _run_cli("serve", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "examples:" in result.stdout
    assert "--otlp-traces-endpoint" in result.stdout


def test_usage_error_exits_2(tmp_path: Path) -> None:
    result = _run_cli("serve", "--http-port", "not-a-port", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_sigint_flushes_and_exits_0(tmp_path: Path) -> None:
    """(SIGTERM is how every other test stops its server, asserting exit 0 too.)"""
    db = tmp_path / "clean.duckdb"
    server = start_serve(db)
    body = vllm_request(25).SerializeToString()
    response = httpx.post(f"{server.http_url}/v1/traces", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400  # protobuf bytes sent as JSON
    response = httpx.post(
        f"{server.http_url}/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}
    )
    assert response.status_code == 200
    assert server.stop(signal.SIGINT) == 0
    assert "stopped; queued data committed" in server.stderr
    assert "Traceback" not in server.stderr
    with Store.open(db, read_only=True) as store:
        assert store.counts()["spans"] == 25


def test_locked_store_and_busy_port_exit_1_with_a_clear_message(tmp_path: Path) -> None:
    db = tmp_path / "owned.duckdb"
    server = start_serve(db, grpc=False)
    try:
        locked = _run_cli("serve", "--db", str(db), "--http-port", "0", "--grpc-port", "0", cwd=tmp_path)
        assert locked.returncode == 1
        assert str(db) in locked.stderr
        assert "lock" in locked.stderr
        assert "Traceback" not in locked.stderr
        port = server.http_url.rsplit(":", 1)[1]
        other = tmp_path / "other.duckdb"
        busy = _run_cli("serve", "--db", str(other), "--http-port", port, "--grpc-port", str(free_port()), cwd=tmp_path)
        assert busy.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr
        assert "Traceback" not in busy.stderr
    finally:
        assert server.stop() == 0


def _spans_table(n: int, first_index: int = 0) -> object:
    body = vllm_request(n, first_index=first_index).SerializeToString()
    return decode_traces(body, "application/x-protobuf", normaliser=Normaliser(hash_key=b"test")).table


def test_writer_acknowledges_after_commit_and_bounds_its_queue(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "writer.duckdb")
    writer = Writer(store, queue_max_rows=10, batch_max_rows=100, flush_interval_s=0.0)
    try:
        first = writer.submit("spans", _spans_table(6))  # not started yet: stays queued
        assert not first.done()
        assert writer.queued_rows == 6
        with pytest.raises(OverloadedError) as refused:
            writer.submit("spans", _spans_table(6, first_index=100))
        assert refused.value.retry_after_s >= 1
        writer.submit("spans", _spans_table(4, first_index=200))  # fills the queue exactly
        with pytest.raises(OverloadedError):
            writer.check_capacity()
        writer.start()
        assert first.result(timeout=30) == 6
        assert store.counts()["spans"] == 10  # both queued requests, one commit
        # A request larger than the whole queue is still taken when the queue is empty.
        assert writer.submit("spans", _spans_table(12, first_index=300)).result(timeout=30) == 12
        # A failing request fails alone; its batch mates are committed.
        bad = writer.submit("spans", _spans_table(1, first_index=400).drop_columns(["span_id"]))
        assert isinstance(bad.exception(timeout=30), StoreError)
    finally:
        pending = writer.submit("spans", _spans_table(3, first_index=500))
        writer.close()
        store.close()
    assert pending.result(timeout=0) == 3  # close() committed what was queued
    with pytest.raises(OverloadedError, match="shutting down"):
        writer.submit("spans", _spans_table(1, first_index=600))
    with Store.open(tmp_path / "writer.duckdb", read_only=True) as reopened:
        assert reopened.counts()["spans"] == 6 + 4 + 12 + 3


def test_writer_bounds_requests_in_progress(tmp_path: Path) -> None:
    with Store.open(tmp_path / "pending.duckdb") as store:
        writer = Writer(store, queue_max_rows=1000, batch_max_rows=1000, flush_interval_s=0.0, max_pending=2)
        with writer.pending(), writer.pending():
            writer.check_capacity()  # two bodies in progress: allowed
            with writer.pending(), pytest.raises(OverloadedError, match="in progress"):
                writer.check_capacity()
        writer.check_capacity()
        writer.close()
