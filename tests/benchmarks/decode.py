"""Decode + normalise benchmark: OTLP protobuf -> canonical Arrow spans, one core.

Builds ``--spans`` vLLM V1-shaped ``llm_request`` spans with 20 attributes each
(telemetry.md 1.3: distinct ids and request ids, varying latencies and token
counts, a handful of models and tenants) in requests of ``--batch`` spans,
serialises them, then times :func:`sre_agent.ingest.otlp.decode_traces` over all
bodies (after one warm-up pass, as a long-running receiver is warm). Reports
process CPU time (stable on a shared machine) and wall time. Also times the
bare upb parse of the same bodies for reference. The last line is::

    decode: spans_per_s=N wall_spans_per_s=W parse_only_spans_per_s=P attributes_per_span=A

``--breakdown`` first prints the CPU cost of each stage in microseconds per
span (the floors behind the decode figure): the full upb parse, the parse
with span attributes left as bytes, reading every attribute through the
message API (the per-attribute Python floor the vectorised decoder avoids),
the per-span loop alone, the vectorised attribute decode alone, and the rest
(canonical columns and Arrow building).

Run: ``python tests/benchmarks/decode.py [--spans 200000] [--batch 1000] [--breakdown]``
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_traces

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingest"))

from otlp_builders import key_values

T0 = 1_760_000_000_000_000_000
PROTOBUF = "application/x-protobuf"
MODELS = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3"]


def span_attributes(rng: random.Random) -> dict[str, object]:
    """20 attributes as vLLM V1 emits them, plus the gateway's route/tenant/model."""
    queue = rng.expovariate(50)
    prefill = rng.uniform(0.02, 0.4)
    decode = rng.uniform(0.5, 8.0)
    prompt = rng.randint(16, 8192)
    output = rng.randint(1, 1024)
    return {
        "gen_ai.request.id": f"chatcmpl-{rng.getrandbits(96):024x}",
        "gen_ai.request.model": rng.choice(MODELS),
        "gen_ai.request.max_tokens": rng.choice([256, 512, 1024, 2048]),
        "gen_ai.request.temperature": rng.choice([0.2, 0.7, 1.0]),
        "gen_ai.request.top_p": rng.choice([0.9, 0.95]),
        "gen_ai.request.n": 1,
        "gen_ai.usage.prompt_tokens": prompt,
        "gen_ai.usage.completion_tokens": output,
        "gen_ai.usage.cached_tokens": rng.randint(0, prompt),
        "gen_ai.latency.time_in_queue": queue,
        "gen_ai.latency.time_to_first_token": queue + prefill,
        "gen_ai.latency.e2e": queue + prefill + decode,
        "gen_ai.latency.time_in_model_prefill": prefill,
        "gen_ai.latency.time_in_model_decode": decode,
        "gen_ai.latency.time_in_model_inference": prefill + decode,
        "gen_ai.response.finish_reasons": rng.choice(['["stop"]', '["length"]']),
        "http.route": "/v1/chat/completions",
        "tenant.id": f"tenant-{rng.randint(1, 40)}",
        "server.address": "vllm-0.vllm.svc",
        "server.port": 8000,
    }


def build_bodies(spans: int, batch: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    bodies = []
    for first in range(0, spans, batch):
        request = ExportTraceServiceRequest()
        resource_spans = request.resource_spans.add()
        resource_spans.resource.attributes.extend(
            key_values(
                {
                    "service.name": "vllm-server",
                    "service.version": "0.11.0",
                    "service.instance.id": "vllm-0",
                    "host.name": "gpu-node-3",
                    "telemetry.sdk.name": "opentelemetry",
                }
            )
        )
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name = "vllm.llm_engine"
        for i in range(first, min(first + batch, spans)):
            span = scope_spans.spans.add(
                trace_id=os.urandom(16),
                span_id=os.urandom(8),
                name="llm_request",
                kind=2,
                start_time_unix_nano=T0 + i * 1_000_000,
                end_time_unix_nano=T0 + i * 1_000_000 + 2_000_000_000,
            )
            span.attributes.extend(key_values(span_attributes(rng)))
        bodies.append(request.SerializeToString())
    return bodies


def _cpu_us_per_span(work: Callable[[bytes], object], bodies: list[bytes], spans: int) -> float:
    started = time.process_time()
    for body in bodies:
        work(body)
    return (time.process_time() - started) / spans * 1e6


def _touch_attributes(body: bytes) -> int:
    """Read every span attribute's key and typed value through the upb message API."""
    touched = 0
    for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                for kv in span.attributes:
                    value = kv.value
                    which = value.WhichOneof("value")
                    if kv.key and which is not None and getattr(value, which) is not None:
                        touched += 1
    return touched


def breakdown(bodies: list[bytes], spans: int, normaliser: Normaliser) -> None:
    """Print the CPU cost of each decode stage, microseconds per span."""
    from sre_agent.ingest import spans as _spans
    from sre_agent.ingest.attrs import decode_attributes
    from sre_agent.ingest.otlp import _lite_request_class

    lite = _lite_request_class()
    stages = {
        "upb parse, full messages": ExportTraceServiceRequest.FromString,
        "upb parse, attributes as bytes": lite.FromString,
        "read every attribute via message API": _touch_attributes,
    }
    for name, work in stages.items():
        print(f"  {name:45s} {_cpu_us_per_span(work, bodies, spans):6.2f} us/span")
    import pyarrow as pa

    collected: list[pa.Array] = []
    # the span loop alone: parse + per-span Python, no column building
    loop = _cpu_us_per_span(lambda body: _spans._collect(lite.FromString(body), normaliser), bodies, spans)
    for body in bodies:
        batch = _spans._collect(lite.FromString(body), normaliser)
        collected.append(pa.array(batch.attributes, pa.list_(pa.binary())).values)
    attrs = _cpu_us_per_span(lambda _: decode_attributes(collected.pop(), normaliser), bodies, spans)
    full = _cpu_us_per_span(lambda body: decode_traces(body, PROTOBUF, normaliser=normaliser), bodies, spans)
    print(f"  {'parse + per-span loop (no columns)':45s} {loop:6.2f} us/span")
    print(f"  {'vectorised attribute decode':45s} {attrs:6.2f} us/span")
    print(f"  {'canonical columns + Arrow (the rest)':45s} {full - loop - attrs:6.2f} us/span")
    print(f"  {'decode_traces total':45s} {full:6.2f} us/span")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--breakdown", action="store_true", help="first print the CPU cost of each stage")
    args = parser.parse_args()
    bodies = build_bodies(args.spans, args.batch)
    normaliser = Normaliser(hash_key=b"benchmark")
    for body in bodies[: max(1, len(bodies) // 10)]:  # warm the caches like a running receiver
        decode_traces(body, "application/x-protobuf", normaliser=normaliser)
    if args.breakdown:
        breakdown(bodies, args.spans, normaliser)

    cpu, wall = time.process_time(), time.perf_counter()
    decoded = 0
    for body in bodies:
        decoded += decode_traces(body, "application/x-protobuf", normaliser=normaliser).table.num_rows
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert decoded == args.spans, decoded

    parse_cpu = time.process_time()
    for body in bodies:
        ExportTraceServiceRequest.FromString(body)
    parse_cpu = time.process_time() - parse_cpu
    print(f"spans={decoded} batch={args.batch} cpu_s={cpu:.2f} wall_s={wall:.2f} load_avg={os.getloadavg()[0]:.1f}")
    print(
        f"decode: spans_per_s={decoded / cpu:.0f} wall_spans_per_s={decoded / wall:.0f} "
        f"parse_only_spans_per_s={decoded / parse_cpu:.0f} attributes_per_span=20"
    )


if __name__ == "__main__":
    main()
