"""Ingest benchmark: OTLP/HTTP protobuf into a real `sre-agent serve`, end to end.

Starts `sre-agent serve` on a temporary store, sends ``--spans`` vLLM V1-shaped
``llm_request`` spans (telemetry.md 1.3 attributes, distinct ids, advancing
timestamps) in requests of ``--batch`` spans from separate sender processes over
several keep-alive connections, waits for every 200, stops the server (SIGTERM,
which flushes) and checks the row count in the file. It also prints the server's
CPU per span and commit statistics (steadier than throughput on a shared
machine). In the same run it measures
how fast opentelemetry-proto alone parses the same payloads
(``ExportTraceServiceRequest.FromString``), and the storage floors: process
CPU of DuckDB appending the same spans (no duplicate check, no decoding timed)
in commits of ``--floor-commit`` spans, by attribute layout (none, the whole
MAP columns of schema 1, the stored ``span_rows`` form, the unmapped attributes
as JSON text), and of the store's duplicate check; and the stage costs: as
``serve`` decodes (collect a request on arrival, build a commit's worth of
requests at once in the stored form) and as file import does (decode one
request, convert it to ``span_rows``). From each layout, the check, the parse
and the CPU of an empty export (client and server), it prints the ceiling
they set: the throughput, and the
ratio, the machine's cores would reach if nothing else (decoding, the
senders) cost anything. The last line is::

    ingest: spans_per_s=N parse_only_spans_per_s=M ratio=R

Run: ``python tests/benchmarks/ingest.py [--spans 1000000] [--senders 2] [--connections 8] [--decode-workers 0]``
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receiver"))

from receiver_harness import T0_NS, count_rows, start_serve, vllm_request

if TYPE_CHECKING:
    import pyarrow as pa

SPAN_SPACING_NS = 1_000_000  # request i of span j starts at T0 + (i * batch + j) ms


class PayloadFactory:
    """Byte-patches one serialised template so that request ``r`` carries distinct ids and times.

    The template is built once with the protobuf API; patching fixed-width
    fields (16-byte trace ids, 8-byte span ids, fixed64 timestamps) is much
    cheaper than rebuilding messages, so the senders stay off the CPU.
    """

    def __init__(self, batch: int) -> None:
        self.batch = batch
        request = vllm_request(batch, first_index=0)
        self.template = bytearray(request.SerializeToString())
        self.patches: list[tuple[int, int, str]] = []  # (offset, span index, field)
        spans = request.resource_spans[0].scope_spans[0].spans
        position = 0
        for i, span in enumerate(spans):
            # Field tags (proto field number << 3 | wire type) make each match unambiguous.
            for tag, value, field in (
                (b"\x0a\x10", span.trace_id, "trace"),
                (b"\x12\x08", span.span_id, "span"),
                (b"\x39", span.start_time_unix_nano.to_bytes(8, "little"), "start"),
                (b"\x41", span.end_time_unix_nano.to_bytes(8, "little"), "end"),
            ):
                found = self.template.find(tag + value, position)
                assert found >= 0, (i, field)
                position = found + len(tag)
                self.patches.append((position, i, field))
        self.durations = [span.end_time_unix_nano - span.start_time_unix_nano for span in spans]

    def payload(self, r: int) -> bytes:
        data = bytearray(self.template)
        for offset, i, field in self.patches:
            index = r * self.batch + i
            if field == "trace":
                data[offset : offset + 16] = (index + 1).to_bytes(16, "big")
            elif field == "span":
                data[offset : offset + 8] = (index + 1).to_bytes(8, "big")
            else:
                start = T0_NS + index * SPAN_SPACING_NS
                value = start if field == "start" else start + self.durations[i]
                data[offset : offset + 8] = value.to_bytes(8, "little")
        return bytes(data)


def _sender(
    url: str, batch: int, requests: list[int], connections: int, result: multiprocessing.Queue, *, go: Any
) -> None:
    """One sender process: ``connections`` threads, each with a keep-alive connection.

    It reports ``"ready"`` once imported and connected, and sends when ``go`` is set, so the
    clock measures ingest, not the senders' interpreter start-up (~0.5 s of CPU each).
    """
    import threading

    factory = PayloadFactory(batch)
    parts = urlsplit(url)
    retries = [0]
    lock = threading.Lock()
    conns = [http.client.HTTPConnection(parts.hostname, parts.port, timeout=120) for _ in range(connections)]
    for conn in conns:
        conn.connect()
    result.put("ready")
    go.wait()
    cpu_before = time.process_time()

    def run(conn: http.client.HTTPConnection, mine: list[int]) -> None:
        for r in mine:
            body = factory.payload(r)
            while True:
                conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    break
                if response.status not in (429, 503):
                    raise RuntimeError(f"request {r}: HTTP {response.status}")
                with lock:
                    retries[0] += 1
                time.sleep(min(float(response.getheader("Retry-After") or 1), 1.0) * 0.1)
        conn.close()

    threads = [threading.Thread(target=run, args=(conns[i], requests[i::connections])) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.put((retries[0], time.process_time() - cpu_before))


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all threads (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def empty_requests(url: str, server_pid: int, requests: int = 2000, connections: int = 4) -> tuple[float, float]:
    """Requests/s, and CPU ms per request (client + server), for empty (zero-span) protobuf exports.

    The HTTP exchange and receiver overhead alone, which every request of the
    run pays on the same cores.
    """
    import threading

    parts = urlsplit(url)

    def run(count: int) -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        for _ in range(count):
            conn.request("POST", "/v1/traces", b"", {"Content-Type": "application/x-protobuf"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
        conn.close()

    threads = [threading.Thread(target=run, args=(requests // connections,)) for _ in range(connections)]
    sent = (requests // connections) * connections
    cpu_before = time.process_time() + _process_cpu_s(server_pid)
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() + _process_cpu_s(server_pid) - cpu_before
    return sent / elapsed, cpu / sent * 1e3


def parse_only_spans_per_s(batch: int, requests: int) -> float:
    """opentelemetry-proto (upb) parsing the same payloads, spans per second, one core."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    factory = PayloadFactory(batch)
    payloads = [factory.payload(r) for r in range(requests)]
    best = 0.0
    for _ in range(3):
        started = time.perf_counter()
        for payload in payloads:
            ExportTraceServiceRequest.FromString(payload)
        best = max(best, requests * batch / (time.perf_counter() - started))
    return best


def _remaining_as_json(rows: pa.Table) -> pa.Table:
    """The two MAP columns as JSON text of the attributes no canonical column is read from (built untimed)."""
    import json

    import pyarrow as pa

    from sre_agent.store.schema import SPAN_ATTRIBUTE_SOURCES

    mapped = {key for keys in SPAN_ATTRIBUTE_SOURCES.values() for key in keys}
    for name in ("attributes", "resource_attributes"):
        texts = [json.dumps({k: v for k, v in m if k not in mapped}) for m in rows.column(name).to_pylist()]
        rows = rows.set_column(rows.schema.get_field_index(name), name, pa.array(texts, pa.string()))
    return rows


def store_floors_us_per_span(batch: int, requests: int, commit: int) -> dict[str, float]:
    """Process CPU (us/span) of DuckDB appending the payloads from Arrow, by attribute layout.

    Layouts: the canonical columns alone; with the two attribute MAP columns
    (the store's layout); with the attributes no canonical column is read
    from as JSON text (the smallest queryable layout the schema allows). The
    most favourable appends there are: a fresh file, no duplicate check, one
    contiguous table (DuckDB scans it cheaper than 512-row chunks), big
    commits; decoding and JSON building happen before the clock starts.
    """
    import duckdb
    import pyarrow as pa

    from sre_agent.ingest.normalise import Normaliser
    from sre_agent.ingest.otlp import build_spans, collect_traces, decode_traces
    from sre_agent.store.span_rows import to_span_rows

    factory = PayloadFactory(batch)
    normaliser = Normaliser(hash_key=b"floor")
    payloads = [factory.payload(r) for r in range(requests)]
    spans = requests * batch
    started = time.process_time()
    decoded = [decode_traces(p, "application/x-protobuf", normaliser=normaliser).table for p in payloads]
    decode_us = (time.process_time() - started) / spans * 1e6
    full = pa.concat_tables(decoded).combine_chunks()
    started = time.process_time()
    stored = pa.concat_tables([to_span_rows(table) for table in decoded]).combine_chunks()
    convert_us = (time.process_time() - started) / full.num_rows * 1e6
    # What `serve` does instead: collect each request on arrival, build a commit's worth at once.
    started = time.process_time()
    collected = [collect_traces(p, "application/x-protobuf", normaliser=normaliser) for p in payloads]
    collect_us = (time.process_time() - started) / spans * 1e6
    together = max(1, 4096 // batch)
    started = time.process_time()
    for first in range(0, requests, together):
        build_spans(collected[first : first + together], stored=True)
    build_us = (time.process_time() - started) / spans * 1e6
    layouts = {
        "canonical columns alone": full.drop_columns(["attributes", "resource_attributes"]),
        "with the whole attribute maps (schema 1)": full,
        "as stored (span_rows: promoted attributes once)": stored,
        "with the remaining attributes as JSON text": _remaining_as_json(full),
    }
    floors = {"decode": decode_us, "convert to span_rows": convert_us, "collect": collect_us, "build": build_us}
    for layout, rows in layouts.items():
        with tempfile.TemporaryDirectory(prefix="sre-agent-floor-") as folder:
            con = duckdb.connect(os.path.join(folder, "floor.duckdb"))
            con.register("_floor", rows.slice(0, 0))
            con.execute("CREATE TABLE spans AS SELECT * FROM _floor")
            started = time.process_time()
            for lo in range(0, rows.num_rows, commit):
                con.register("_floor", rows.slice(lo, commit))
                con.execute("INSERT INTO spans SELECT * FROM _floor")
                con.unregister("_floor")
            con.execute("CHECKPOINT")
            floors[layout] = (time.process_time() - started) / rows.num_rows * 1e6
            con.close()
    # The duplicate check the store must run on every commit (idempotence on trace and span id),
    # timed as Store.append_spans re-appending stored rows: only the check runs then.
    from sre_agent.store.embedded import Store

    scratch = tempfile.TemporaryDirectory(prefix="sre-agent-floor-")
    with scratch, Store.open(Path(scratch.name) / "d.duckdb") as store:
        commits = [full.slice(lo, commit) for lo in range(0, full.num_rows, commit)]
        for rows in commits:
            store.append_spans(rows)
        started = time.process_time()
        assert sum(store.append_spans(rows) for rows in commits) == 0
        floors["duplicate check"] = (time.process_time() - started) / full.num_rows * 1e6
    return floors


def _server_usage(pid: int, url: str, spans: int, elapsed: float) -> str:
    """The server's CPU per span (Linux /proc, all threads) and its commit statistics.

    CPU per span is steadier than throughput on a shared machine: it is what
    the server costs, whatever else competes for the cores.
    """
    import urllib.request

    per_thread: list[float] = []
    tick = os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            per_thread.append((int(fields[11]) + int(fields[12])) / tick / spans * 1e6)
    per_thread.sort(reverse=True)
    metrics = dict(
        line.rsplit(" ", 1)
        for line in urllib.request.urlopen(url + "/metrics", timeout=10).read().decode().splitlines()
        if line.startswith("sre_agent_receiver_commit_seconds_")
    )
    commits = float(metrics.get("sre_agent_receiver_commit_seconds_count", "0"))
    busy = float(metrics.get("sre_agent_receiver_commit_seconds_sum", "0"))
    threads = ", ".join(f"{t:.1f}" for t in per_thread[:3])
    return (
        f"server: cpu_us_per_span={sum(per_thread):.1f} (busiest threads {threads}) commits={commits:.0f} "
        f"spans_per_commit={spans / max(commits, 1):.0f} writer_busy={busy / elapsed:.0%}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=1_000_000, help="spans to send (rounded down to whole batches)")
    parser.add_argument("--batch", type=int, default=512, help="spans per request")
    parser.add_argument("--senders", type=int, default=2, help="sender processes")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections per sender process")
    parser.add_argument("--decode-workers", type=int, default=0, help="passed to `sre-agent serve --decode-workers`")
    parser.add_argument("--db", type=Path, help="store file (default: a temporary directory)")
    parser.add_argument("--floor-commit", type=int, default=32768, help="spans per commit of the storage floor")
    args = parser.parse_args()

    requests = args.spans // args.batch
    total = requests * args.batch
    tmp = tempfile.TemporaryDirectory(prefix="sre-agent-bench-")
    db = args.db or Path(tmp.name) / "ingest.duckdb"
    # The harness starts serve without SRE_AGENT_* settings; this benchmark passes them on, so that
    # e.g. SRE_AGENT_FLUSH_INTERVAL_S=0 can be compared against the default.
    settings = {k: v for k, v in os.environ.items() if k.startswith("SRE_AGENT_")}
    server = start_serve(db, "--decode-workers", str(args.decode_workers), grpc=False, env=settings)
    print(f"serve pid {server.proc.pid} on {server.http_url}, store {db}", file=sys.stderr)
    overhead, http_cpu_ms = empty_requests(server.http_url, server.proc.pid)
    print(
        f"receiver overhead: {overhead:.0f} empty requests/s ({1000 / overhead:.2f} ms per request, "
        f"{http_cpu_ms:.2f} ms CPU per request, client and server)"
    )
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = ctx.Queue()
    go = ctx.Event()
    indices = list(range(requests))
    senders = [
        ctx.Process(
            target=_sender,
            args=(server.http_url, args.batch, indices[i :: args.senders], args.connections, results),
            kwargs={"go": go},
        )
        for i in range(args.senders)
    ]
    try:
        launched = time.perf_counter()
        for process in senders:
            process.start()
        ready = [results.get(timeout=300) for _ in senders]
        assert ready == ["ready"] * len(senders), ready
        started = time.perf_counter()
        go.set()
        reports = [results.get(timeout=3600) for _ in senders]
        retries = sum(r for r, _ in reports)
        sender_cpu_s = sum(c for _, c in reports)
        elapsed = time.perf_counter() - started
        with_startup = time.perf_counter() - launched
        for process in senders:
            process.join()
            if process.exitcode != 0:
                raise SystemExit(f"a sender failed (exit {process.exitcode})")
        server_line = _server_usage(server.proc.pid, server.http_url, total, elapsed)
    finally:
        code = server.stop()
    if code != 0:
        raise SystemExit(f"serve exited {code}: {server.stderr}")
    stored = count_rows(db)
    if stored != total:
        raise SystemExit(f"row count mismatch: sent {total}, stored {stored}")
    spans_per_s = total / elapsed
    print(
        f"sent {total} spans in {requests} requests in {elapsed:.2f} s ({retries} retried after 429/503); "
        f"{with_startup:.2f} s counting the senders' start-up ({total / with_startup:.0f} spans/s, "
        "the figure this benchmark printed before 2026-12-06)"
    )
    print(server_line)
    print(
        f"senders: cpu_us_per_span={sender_cpu_s / total * 1e6:.1f} "
        f"(building payloads and HTTP, {args.senders} processes)"
    )
    parse_only = parse_only_spans_per_s(args.batch, min(requests, 200))
    ratio = spans_per_s / parse_only
    floors = store_floors_us_per_span(args.batch, min(requests, 200), args.floor_commit)
    cores = len(os.sched_getaffinity(0))
    parse_us, http_us = 1e6 / parse_only, http_cpu_ms * 1e3 / args.batch
    check_us = floors.pop("duplicate check")
    decode_us, convert_us = floors.pop("decode"), floors.pop("convert to span_rows")
    collect_us, build_us = floors.pop("collect"), floors.pop("build")
    print(
        f"floors: parse_us_per_span={parse_us:.2f} http_us_per_span={http_us:.2f} "
        f"duplicate_check_us_per_span={check_us:.2f} cores={cores}"
    )
    print(
        f"stages (serve): collect_us_per_span={collect_us:.2f} (event loop, per request) "
        f"build_stored_us_per_span={build_us:.2f} (writer, {max(1, 4096 // args.batch)} requests at once)"
    )
    print(
        f"stages (files, one request at a time): decode_us_per_span={decode_us:.2f} "
        f"convert_to_span_rows_us_per_span={convert_us:.2f}"
    )
    for layout, append_us in floors.items():
        # Counted: the parse, the empty HTTP exchange, the bare append and the duplicate check. Taken
        # as free: decoding, the senders' work; the cores as perfectly shared.
        ceiling = cores / (append_us + parse_us + http_us + check_us) * 1e6
        print(
            f"  append {layout}: {append_us:.2f} us/span -> ceiling_spans_per_s={ceiling:.0f} "
            f"ceiling_ratio={ceiling / parse_only:.3f}"
        )
    print(f"ingest: spans_per_s={spans_per_s:.0f} parse_only_spans_per_s={parse_only:.0f} ratio={ratio:.3f}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
