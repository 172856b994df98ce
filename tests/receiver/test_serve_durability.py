"""Durability and overload against a real `sre-agent serve`: a 200 means committed,
SIGKILL loses nothing acknowledged, re-sends do not double-count, a flood gets
429 + Retry-After while memory stays bounded."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
from receiver_harness import ServeProcess, count_rows, start_serve, vllm_request

PROTOBUF = {"content-type": "application/x-protobuf"}
BATCH = 100


def _send_batches(url: str, batches: list[int], acked: set[int], stop: threading.Event) -> None:
    """POST each batch index (spans batch*BATCH ...) until ``stop``; remember the ones answered 200."""
    with httpx.Client(base_url=url, timeout=30) as client:
        for batch in batches:
            if stop.is_set():
                return
            body = vllm_request(BATCH, first_index=batch * BATCH).SerializeToString()
            try:
                response = client.post("/v1/traces", content=body, headers=PROTOBUF)
            except httpx.HTTPError:
                return  # the server died under us: this batch is not acknowledged
            if response.status_code == 200:
                acked.add(batch)


def _stream_then_signal(server: ServeProcess, batches: list[int], acked: set[int], wait_for: int, sig: int) -> int:
    """Three senders stream ``batches``; once ``wait_for`` are acknowledged, send ``sig`` mid-stream.

    Returns the server's exit code after the senders have stopped.
    """
    stop = threading.Event()
    senders = [
        threading.Thread(target=_send_batches, args=(server.http_url, batches[i::3], acked, stop)) for i in range(3)
    ]
    for sender in senders:
        sender.start()
    deadline = time.monotonic() + 60
    while len(acked) < wait_for and time.monotonic() < deadline:
        time.sleep(0.01)
    code = server.stop(sig)
    stop.set()
    for sender in senders:
        sender.join(30)
    assert len(acked) >= wait_for
    return code


def test_sigkill_loses_no_acknowledged_span_and_resends_do_not_double_count(tmp_path: Path) -> None:
    db = tmp_path / "durable.duckdb"
    server = start_serve(db, grpc=False)
    acked: set[int] = set()
    all_batches = list(range(300))
    assert _stream_then_signal(server, all_batches, acked, 15, signal.SIGKILL) == -signal.SIGKILL

    acked_now = set(acked)
    restarted = start_serve(db, grpc=False)
    try:
        with httpx.Client(base_url=restarted.http_url, timeout=30) as client:
            # Every acknowledged span survived the SIGKILL.
            for batch in sorted(acked_now):
                first = batch * BATCH
                spans = client.get("/api/v1/spans", params={"trace_id": f"{first + 1:032x}"}).json()["spans"]
                assert len(spans) == 1, f"acknowledged batch {batch} lost"
            stored_after_crash = client.get("/api/v1/status").json()["spans"]
            assert stored_after_crash >= len(acked_now) * BATCH
            # The client re-sends (at-least-once delivery), some batches twice: nothing is stored twice.
            resend = sorted(acked_now)[:5] + all_batches[:20]
            with ThreadPoolExecutor(4) as pool:
                for part in range(4):
                    pool.submit(_send_batches, restarted.http_url, resend[part::4], acked, threading.Event())
    finally:
        assert restarted.stop() == 0, restarted.stderr
    present = _batches_present(db)
    assert present >= acked_now | set(all_batches[:20])
    # Whole batches only (a batch is one commit), each span exactly once.
    assert count_rows(db) == len(present) * BATCH


def test_sigterm_mid_stream_commits_every_acknowledged_request_and_exits_0(tmp_path: Path) -> None:
    db = tmp_path / "graceful.duckdb"
    server = start_serve(db, grpc=False)
    acked: set[int] = set()
    assert _stream_then_signal(server, list(range(200)), acked, 6, signal.SIGTERM) == 0, server.stderr
    present = _batches_present(db)
    assert present >= acked
    assert count_rows(db) == len(present) * BATCH


def _batches_present(db: Path) -> set[int]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT DISTINCT (('0x' || trace_id)::UBIGINT - 1) // ? FROM spans", [BATCH]).fetchall()
    finally:
        con.close()
    return {int(r[0]) for r in rows}


def test_flood_gets_429_with_retry_after_and_memory_stays_bounded(tmp_path: Path) -> None:
    db = tmp_path / "flood.duckdb"
    spans_per_request, distinct, senders, per_sender = 500, 6, 6, 30
    env = {"SRE_AGENT_QUEUE_MAX_SPANS": str(spans_per_request), "SRE_AGENT_BATCH_MAX_SPANS": str(spans_per_request)}
    server = start_serve(db, env=env, grpc=False)
    process = psutil.Process(server.proc.pid)
    payloads = [
        vllm_request(spans_per_request, first_index=i * spans_per_request).SerializeToString() for i in range(distinct)
    ]
    statuses: list[tuple[int, str | None, int]] = []
    lock = threading.Lock()

    def flood(sender: int, count: int = per_sender) -> None:
        with httpx.Client(base_url=server.http_url, timeout=60) as client:
            for n in range(count):
                index = (sender + n) % distinct
                response = client.post("/v1/traces", content=payloads[index], headers=PROTOBUF)
                with lock:
                    statuses.append((response.status_code, response.headers.get("retry-after"), index))

    try:
        # Warm up with the same concurrency as the flood: the first decode and commit, and
        # the allocator's per-thread arenas (one per concurrently served request, a few MiB
        # each), are steady-state costs, not memory that follows the offered volume.
        with ThreadPoolExecutor(senders) as pool:
            list(pool.map(lambda sender: flood(sender, count=distinct), range(senders)))
        warm_up = len(statuses)
        baseline_rss = peak_rss = process.memory_info().rss
        with ThreadPoolExecutor(senders) as pool:
            futures = [pool.submit(flood, sender) for sender in range(senders)]
            while not all(f.done() for f in futures):
                peak_rss = max(peak_rss, process.memory_info().rss)
                time.sleep(0.02)
            for future in futures:
                future.result()
        metrics = httpx.get(f"{server.http_url}/metrics").text
    finally:
        assert server.stop() == 0, server.stderr
    codes = [code for code, _, _ in statuses[warm_up:]]
    assert set(codes) <= {200, 429}
    assert codes.count(429) > 0
    assert codes.count(200) > 0
    assert all(retry is not None and int(retry) >= 1 for code, retry, _ in statuses if code == 429)
    assert 'code="429"' in metrics
    accepted = {index for code, _, index in statuses if code == 200}
    assert count_rows(db) == len(accepted) * spans_per_request
    # The queue holds at most one request's rows and refused bodies are never read:
    # memory does not follow the offered volume.
    offered_mb = senders * per_sender * len(payloads[0]) / 2**20
    grown_mb = (peak_rss - baseline_rss) / 2**20
    print(f"flood: offered {offered_mb:.0f} MiB, RSS grew {grown_mb:.1f} MiB")
    assert grown_mb < min(64, offered_mb / 2), (grown_mb, offered_mb)
