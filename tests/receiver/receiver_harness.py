"""Helpers for the receiver tests and the ingest benchmark: a real `sre-agent serve`
subprocess on ephemeral loopback ports, and vLLM-shaped OTLP payload builders."""

from __future__ import annotations

import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

READY_TIMEOUT_S = 30.0
T0_NS = 1_790_000_000_000_000_000  # 2026-09-21, Unix ns


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (for gRPC, where 0 means "disabled")."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServeProcess:
    """A running `sre-agent serve` child; stderr is collected line by line."""

    proc: subprocess.Popen[str]
    db: Path
    http_url: str = ""
    grpc_target: str | None = None
    stderr_lines: list[str] = field(default_factory=list)
    _lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _pump_thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"serve not ready in time; stderr: {''.join(self.stderr_lines)}") from None
            if line is None:
                raise AssertionError(f"serve exited early ({self.proc.wait()}): {''.join(self.stderr_lines)}")
            if "API on " in line:  # "OTLP/HTTP and API on URL", or "API on URL" for serve --read
                self.http_url = line.rsplit(" ", 1)[1].strip()
            elif "OTLP/gRPC on " in line:
                self.grpc_target = line.rsplit(" ", 1)[1].strip()
            elif "ready" in line:
                return

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Send ``sig`` and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout_s)
        self._pump_thread.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    @property
    def url(self) -> str:
        """Base URL of the HTTP API (the same server as the OTLP/HTTP receiver)."""
        return self.http_url


def start_serve(db: Path, *args: str, env: dict[str, str] | None = None, grpc: bool = True) -> ServeProcess:
    """Start `python -m sre_agent serve` on ephemeral ports and wait until it is ready."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SRE_AGENT_")}
    child_env.update(env or {})
    command = [
        sys.executable,
        "-m",
        "sre_agent",
        "serve",
        "--db",
        str(db),
        "--http-port",
        "0",
        "--grpc-port",
        str(free_port() if grpc else 0),
        *args,
    ]
    return start_process(command, db, child_env)


def start_process(command: list[str], db: Path, env: dict[str, str]) -> ServeProcess:
    """Start a serve ``command`` (its store ``db``) and wait until it says it is ready."""
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=db.parent
    )
    server = ServeProcess(proc=proc, db=db)
    try:
        server.wait_ready()
    except BaseException:
        server.stop(signal.SIGKILL)
        raise
    return server


def _kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def vllm_span_attributes(rng: random.Random, index: int) -> list[KeyValue]:
    """Attributes of a vLLM V1 (0.10-0.34) ``llm_request`` span (telemetry.md 1.3)."""
    queue_s = rng.expovariate(20.0)
    prefill_s = rng.uniform(0.02, 0.3)
    completion = rng.randint(16, 1024)
    decode_s = completion * rng.uniform(0.01, 0.03)
    attrs: dict[str, Any] = {
        "gen_ai.request.id": f"cmpl-{index:016x}",
        "gen_ai.usage.prompt_tokens": rng.randint(32, 4096),
        "gen_ai.usage.completion_tokens": completion,
        "gen_ai.latency.time_in_queue": queue_s,
        "gen_ai.latency.time_to_first_token": queue_s + prefill_s + 0.004,
        "gen_ai.latency.e2e": queue_s + prefill_s + decode_s + 0.006,
        "gen_ai.latency.time_in_model_prefill": prefill_s,
        "gen_ai.latency.time_in_model_decode": decode_s,
        "gen_ai.latency.time_in_model_inference": prefill_s + decode_s,
        "gen_ai.request.max_tokens": 2048,
    }
    # V1 leaves temperature/top_p/n out when they are zero (falsy).
    if index % 3:
        attrs["gen_ai.request.temperature"] = 0.7
        attrs["gen_ai.request.top_p"] = 0.95
    return [_kv(k, v) for k, v in attrs.items()]


def vllm_request(
    n_spans: int,
    *,
    first_index: int = 0,
    seed: int = 0,
    tenant: str | None = None,
    service_version: str = "0.11.0",
    start_ns: int | None = None,
) -> ExportTraceServiceRequest:
    """An ExportTraceServiceRequest of ``n_spans`` distinct vLLM ``llm_request`` spans.

    Span ``i`` has trace id ``first_index + i`` (as 32 hex digits), so
    requests built with disjoint index ranges never collide.
    """
    rng = random.Random(seed * 1_000_003 + first_index)
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource = {"service.name": "vllm-server", "service.version": service_version, "host.name": "gpu-node-1"}
    if tenant is not None:
        resource["tenant.id"] = tenant
    resource_spans.resource.attributes.extend(_kv(k, v) for k, v in resource.items())
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "vllm.llm_engine"
    # Deterministic: a re-sent request is byte-identical, as an OTLP retry is.
    base = start_ns if start_ns is not None else T0_NS
    for i in range(n_spans):
        index = first_index + i
        span = scope_spans.spans.add()
        span.trace_id = (index + 1).to_bytes(16, "big")
        span.span_id = (index + 1).to_bytes(8, "big")
        span.name = "llm_request"
        span.kind = Span.SPAN_KIND_SERVER
        span.start_time_unix_nano = base + index * 1_000_000
        span.end_time_unix_nano = span.start_time_unix_nano + rng.randint(50_000_000, 20_000_000_000)
        span.attributes.extend(vllm_span_attributes(rng, index))
    return request


def trace_hex(index: int) -> str:
    """The trace id (hex) :func:`vllm_request` gives span ``index``."""
    return f"{index + 1:032x}"


def count_rows(db: Path, table: str = "spans", where: str = "") -> int:
    """Rows in ``table`` of a store no process holds, opened read-only."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute(f"SELECT count(*) FROM {table} {where}").fetchone()
        return int(row[0]) if row else 0
    finally:
        con.close()
