"""File ingest: collector JSON lines, OTLP JSON documents, length-prefixed protobuf, gzip."""

from __future__ import annotations

import gzip
import json
import shutil
import tracemalloc
from pathlib import Path

import pytest
from otlp_builders import T0, VLLM_V1, metrics_request, otlp_json, trace_request

from sre_agent.ingest.files import ingest_files
from sre_agent.ingest.normalise import Normaliser
from sre_agent.store.embedded import Store

FIXTURES = Path(__file__).parent / "fixtures"
MiB = 1024 * 1024


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    with Store.open(tmp_path / "files.duckdb") as opened:
        yield opened


@pytest.fixture
def norm(store: Store) -> Normaliser:
    return Normaliser(hash_key=store.hash_key)


def _traces_line(n: int, start: int = T0) -> str:
    request = trace_request([{"attributes": VLLM_V1, "start": start + i} for i in range(n)])
    return json.dumps(otlp_json(request))


def _metrics_line() -> str:
    request = metrics_request(
        [{"name": "vllm:num_requests_running", "kind": "gauge", "points": [{"time": T0, "value": 2.0}]}]
    )
    return json.dumps(otlp_json(request))


def _length_prefixed(*messages: bytes) -> bytes:
    return b"".join(len(m).to_bytes(4, "big") + m for m in messages)


def test_json_lines_with_bad_lines(tmp_path: Path, store: Store, norm: Normaliser) -> None:
    path = tmp_path / "export.jsonl"
    lines = [
        _traces_line(3),
        "{ this is not json",
        "",
        _metrics_line(),
        '{"resourceLogs": []}',
        _traces_line(2, start=T0 + 10**9),
        '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz", "spanId": "00f067aa0ba902b7"}]}]}]}',
    ]
    path.write_text("\n".join(lines) + "\n")
    (result,) = ingest_files([path], store, norm)
    assert (result.format, result.spans, result.points, result.inserted) == ("jsonl", 5, 1, 6)
    assert [n for n, _ in result.bad_lines] == [2, 5, 7]
    assert "invalid JSON" in result.bad_lines[0][1]
    assert "logs" in result.bad_lines[1][1]
    assert "1 spans rejected" in result.bad_lines[2][1]
    assert result.rejected == 3
    assert not result.ok
    assert store.counts() == {"spans": 5, "metric_points": 1, "deploys": 0}


def test_reingesting_a_file_counts_duplicates(tmp_path: Path, store: Store, norm: Normaliser) -> None:
    path = tmp_path / "again.jsonl"
    path.write_text(_traces_line(4) + "\n")
    first, second = ingest_files([path, path], store, norm)
    assert (first.inserted, first.duplicates) == (4, 0)
    assert (second.inserted, second.duplicates, second.ok) == (0, 4, True)


def test_pretty_printed_example_document(tmp_path: Path, store: Store, norm: Normaliser) -> None:
    (result,) = ingest_files([FIXTURES / "trace.json"], store, norm)
    assert (result.format, result.spans, result.rejected) == ("json", 1, 0)
    row = store.connection.execute("SELECT name, service_name, trace_id FROM spans").fetchone()
    assert row == ("I'm a server span", "my.service", "5b8efff798038103d269b633813fc60c")


def test_length_prefixed_protobuf_traces_and_metrics(tmp_path: Path, store: Store, norm: Normaliser) -> None:
    traces = trace_request([{"attributes": VLLM_V1, "start": T0 + i} for i in range(6)]).SerializeToString()
    metrics = metrics_request(
        [{"name": "vllm:prefix_cache_hits_total", "kind": "sum", "points": [{"time": T0, "value": 9}]}]
    ).SerializeToString()
    path = tmp_path / "export.pb"
    path.write_bytes(_length_prefixed(traces, metrics, traces))
    (result,) = ingest_files([path], store, norm)
    assert (result.format, result.spans, result.points) == ("protobuf", 12, 1)
    assert (result.inserted, result.duplicates, result.rejected) == (7, 6, 0)
    name = store.connection.execute("SELECT name FROM metric_points").fetchone()
    assert name == ("vllm:prefix_cache_hits",)


def test_truncated_length_prefixed_file_keeps_complete_messages(tmp_path: Path, store: Store, norm: Normaliser) -> None:
    message = trace_request([{"attributes": VLLM_V1}]).SerializeToString()
    path = tmp_path / "cut.pb"
    path.write_bytes(_length_prefixed(message, message)[:-5])
    (result,) = ingest_files([path], store, norm)
    assert result.spans == 1
    assert result.bad_lines[0][0] == 2
    assert "truncated" in result.bad_lines[0][1]


@pytest.mark.parametrize("name", ["export.jsonl.gz", "export.pb.gz", "trace.json.gz"])
def test_gzip_variants(name: str, tmp_path: Path, store: Store, norm: Normaliser) -> None:
    path = tmp_path / name
    if name.startswith("trace"):
        payload = (FIXTURES / "trace.json").read_bytes()
    elif ".pb" in name:
        payload = _length_prefixed(trace_request([{"attributes": VLLM_V1}]).SerializeToString())
    else:
        payload = (_traces_line(1) + "\n").encode()
    path.write_bytes(gzip.compress(payload))
    (result,) = ingest_files([path], store, norm)
    assert result.ok
    assert result.spans == 1
    assert result.format is not None
    assert result.format.endswith("+gzip")


def test_gzip_bomb_is_rejected_without_blowing_memory(tmp_path: Path, store: Store, norm: Normaliser) -> None:
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=6) as out:
        out.write(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "')
        chunk = b"A" * MiB
        for _ in range(64):  # 64 MiB in one line, well under 1 MiB compressed
            out.write(chunk)
        out.write(b'"}]}]}]}\n')
        out.write((_traces_line(2) + "\n").encode())
    assert path.stat().st_size < MiB
    tracemalloc.start()
    try:
        (result,) = ingest_files([path], store, norm, max_body_bytes=MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MiB  # a reader holding the line would need 64 MiB
    assert result.bad_lines == [(1, "line longer than the body cap; skipped")]
    assert result.spans == 2  # the good line after the bomb still loads


def test_single_document_over_the_cap_is_rejected(tmp_path: Path, store: Store, norm: Normaliser) -> None:
    path = tmp_path / "big.json"
    shutil.copy(FIXTURES / "trace.json", path)
    (result,) = ingest_files([path], store, norm, max_body_bytes=100)
    assert result.spans == 0
    assert result.rejected >= 1


def test_missing_empty_and_corrupt_gzip_files(tmp_path: Path, store: Store, norm: Normaliser) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    corrupt = tmp_path / "corrupt.gz"
    corrupt.write_bytes(gzip.compress((_traces_line(1) + "\n").encode())[:-12])
    good = tmp_path / "good.jsonl"
    good.write_text(_traces_line(2) + "\n")
    missing, empty_result, corrupt_result, good_result = ingest_files(
        [tmp_path / "nope.jsonl", empty, corrupt, good], store, norm
    )
    assert missing.error == "no such file"
    assert empty_result.ok
    assert empty_result.spans == 0
    assert corrupt_result.error is not None or corrupt_result.rejected
    assert good_result.ok
    assert good_result.spans == 2


def test_progress_reports_reach_the_file_size(tmp_path: Path, store: Store, norm: Normaliser) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(_traces_line(1, start=T0 + i) for i in range(50)) + "\n")
    calls: list[tuple[str, int, int]] = []
    ingest_files([path], store, norm, progress=lambda *a: calls.append(a))
    assert calls[-1] == (str(path), path.stat().st_size, path.stat().st_size)
