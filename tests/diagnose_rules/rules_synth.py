"""Synthetic stores for the mechanism-rule tests, built from serving mechanics.

Each replica runs at most ``slots`` requests at once (a FIFO queue in front).
A request's prefill costs its *uncached* prompt tokens x seconds per token;
its time per output token grows with the requests running beside it
(``tpot_s x (1 + batch_cost x running)``), so more load gives slower tokens
without anything in the engine changing. Optional parts: gateway root spans
with a retrieval dependency and attempt spans (retries carry
``http.request.resend_count``), and a metric stream (prefix-cache counters,
running and KV gauges, a preemption counter, the tokens-per-step histogram).
Tables come from ``sre_agent.store.schema``'s DDL.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from sre_agent.store import schema
from sre_agent.store.span_rows import to_span_rows

NS = 1_000_000_000
T0 = 1_790_000_000.0
#: vLLM's default e2e latency buckets (seconds), the first ones.
E2E_BOUNDS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
#: vLLM's inter-token latency buckets (seconds), the first ones.
ITL_BOUNDS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
ITERATION_BOUNDS = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0]


@dataclass
class Side:
    """One window's workload, engine behaviour and telemetry knobs."""

    version: str = "v1"
    rate_rps: float = 4.0
    duration_s: float = 200.0
    replicas: int = 2
    slots: int = 16
    cache_hit: float = 0.5
    prefill_s_per_token: float = 2e-4
    tpot_s: float = 0.02
    batch_cost: float = 0.05
    input_mean: float = 800.0
    output_mean: float = 60.0
    length_share: float = 0.02
    retry_share: float = 0.0
    retrieval_s: dict[str, float] = field(default_factory=lambda: {"acme": 0.05, "globex": 0.05})
    kv_usage: float = 0.4
    kv_per_running: float | None = None  # set: the KV usage gauge is this share x running requests (capped at 1)
    preemptions: int = 0
    preempting_replicas: tuple[int, ...] | None = None  # None: spread over every replica
    step_tokens_cap: int = 8192
    burst_s: float = 0.0  # > 0: arrivals at twice the rate for burst_s, then none for burst_s (same mean)
    # > 0: a replica takes prompts in one at a time, each holding admission for its uncached tokens x this
    # (a step budget far below the prompts: the next prompt waits, and the requests waiting are not running).
    admit_s_per_token: float = 0.0


def _lognormal(rng: random.Random, mean: float, sigma: float = 0.5) -> float:
    return math.exp(rng.gauss(math.log(mean) - sigma * sigma / 2, sigma))


def _simulate(side: Side, start: float, rng: random.Random) -> list[dict[str, Any]]:
    busy: dict[int, list[float]] = {r: [] for r in range(side.replicas)}
    gate = dict.fromkeys(range(side.replicas), start)  # when each replica admits its next prompt
    out: list[dict[str, Any]] = []
    t = start
    while True:
        t += rng.expovariate(side.rate_rps * (2 if side.burst_s > 0 else 1))
        if side.burst_s > 0 and int((t - start) // side.burst_s) % 2:
            t = start + (int((t - start) // side.burst_s) + 1) * side.burst_s  # the quiet half: skip it
        if t >= start + side.duration_s:
            return out
        replica = rng.randrange(side.replicas)
        heap = busy[replica]
        while heap and heap[0] <= t:
            heapq.heappop(heap)
        begin = t if len(heap) < side.slots else heapq.heappop(heap)
        inp = max(8, int(_lognormal(rng, side.input_mean)))
        outp = max(2, int(_lognormal(rng, side.output_mean)))
        cached = int(inp * side.cache_hit * rng.uniform(0.8, 1.0))
        if side.admit_s_per_token > 0:
            begin = max(begin, gate[replica])
            gate[replica] = begin + (inp - cached) * side.admit_s_per_token
        running = sum(1 for e in heap if e > begin) + 1
        prefill = (inp - cached) * side.prefill_s_per_token * rng.uniform(0.9, 1.1)
        tpot = side.tpot_s * (1 + side.batch_cost * running) * rng.uniform(0.9, 1.1)
        end = begin + prefill + (outp - 1) * tpot
        heapq.heappush(heap, end)
        tenant = rng.choice(("acme", "globex"))
        out.append({"arrival": t, "begin": begin, "first": begin + prefill, "end": end, "host": f"gpu-{replica}",
                    "tenant": tenant, "input": inp, "output": outp, "cached": cached,
                    "finish": "length" if rng.random() < side.length_share else "stop",
                    "retried": rng.random() < side.retry_share,
                    "retrieval": side.retrieval_s[tenant] * rng.uniform(0.8, 1.2)})  # fmt: skip


def _spans(  # noqa: PLR0917 - the build's options, passed once
    reqs: list[dict[str, Any]], side: Side, gateway: bool, cached: bool, rng: random.Random, engine: bool = True
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for r in reqs:
        trace = f"{rng.getrandbits(128):032x}"
        arrival, end = r["arrival"], r["end"]
        parent = None
        if gateway:
            root = f"{rng.getrandbits(64):016x}"
            g0 = arrival - r["retrieval"] - (0.5 if r["retried"] else 0.0) - 0.002
            gw = {"trace_id": trace, "status_code": "unset", "is_engine": False, "service_name": "llm-gateway",
                  "service_version": "g1", "resource_attributes": {"service.name": "llm-gateway"}}  # fmt: skip
            rows.append({**gw, "span_id": root, "parent_span_id": None, "name": "POST /v1/chat", "kind": "server",
                         "start_ns": int(g0 * NS), "end_ns": int((end + 0.002) * NS), "duration_s": end + 0.002 - g0,
                         "tenant_id": r["tenant"], "attributes": {"tenant.id": r["tenant"]}})  # fmt: skip
            rows.append({**gw, "span_id": f"{rng.getrandbits(64):016x}", "parent_span_id": root, "name": "retrieval",
                         "kind": "client", "start_ns": int(g0 * NS), "end_ns": int((g0 + r["retrieval"]) * NS),
                         "duration_s": r["retrieval"], "attributes": {"peer.service": "retrieval"}})  # fmt: skip
            if r["retried"]:  # a failed first attempt (no engine span), then the resend
                t1 = g0 + r["retrieval"]
                rows.append({**gw, "span_id": f"{rng.getrandbits(64):016x}", "parent_span_id": root, "name": "POST",
                             "kind": "client", "start_ns": int(t1 * NS), "end_ns": int((t1 + 0.5) * NS),
                             "duration_s": 0.5, "status_code": "error", "error_type": "timeout",
                             "attributes": {}})  # fmt: skip
            parent = f"{rng.getrandbits(64):016x}"
            rows.append({**gw, "span_id": parent, "parent_span_id": root, "name": "POST", "kind": "client",
                         "start_ns": int(arrival * NS), "end_ns": int(end * NS), "duration_s": end - arrival,
                         "attempt": 1 if r["retried"] else None,
                         # Without engine spans the model the gateway names marks the call as inference.
                         "model": None if engine else "m",
                         "attributes": {"http.request.resend_count": "1"} if r["retried"] else {}})  # fmt: skip
        if not engine:
            continue
        queue, prefill, decode = r["begin"] - arrival, r["first"] - r["begin"], end - r["first"]
        rows.append({"trace_id": trace, "span_id": f"{rng.getrandbits(64):016x}", "parent_span_id": parent,
                     "name": "llm_request", "kind": "server", "start_ns": int(arrival * NS), "end_ns": int(end * NS),
                     "duration_s": end - arrival, "status_code": "unset", "service_name": "vllm",
                     "service_version": side.version, "service_instance": r["host"], "host_name": r["host"],
                     "tenant_id": r["tenant"], "is_engine": True, "model": "m", "input_tokens": r["input"],
                     "output_tokens": r["output"], "cached_tokens": r["cached"] if cached else None,
                     "queue_s": queue, "ttft_s": queue + prefill, "prefill_s": prefill, "decode_s": decode,
                     "inference_s": prefill + decode, "e2e_s": end - arrival,
                     "tpot_s": decode / (r["output"] - 1), "finish_reason": r["finish"],
                     "resource_attributes": {"host.name": r["host"], "service.version": side.version},
                     "attributes": {"tenant.id": r["tenant"]}})  # fmt: skip
    return rows


def _histogram(values: list[float]) -> list[int]:
    counts = [0] * (len(ITERATION_BOUNDS) + 1)
    for v in values:
        i = next((k for k, b in enumerate(ITERATION_BOUNDS) if v <= b), len(ITERATION_BOUNDS))
        counts[i] += 1
    return counts


def _metrics(  # noqa: PLR0917 - the build's options, passed once
    reqs: list[dict[str, Any]],
    side: Side,
    start: float,
    rng: random.Random,
    latency: bool = False,
    waiting: bool = False,
) -> list[dict[str, Any]]:
    """Cumulative counters and histograms every 10 s per replica, as an OTel Collector delivers vLLM's metrics.

    ``latency`` adds the e2e latency histogram of the requests finished by each scrape; it and
    ``waiting`` add the waiting-requests gauge.
    """
    rows: list[dict[str, Any]] = []
    for replica in range(side.replicas):
        host = f"gpu-{replica}"
        mine = sorted((r for r in reqs if r["host"] == host), key=lambda r: r["begin"])
        totals = {"queries": 0.0, "hits": 0.0, "prompt": 0.0, "generated": 0.0, "preempt": 0.0}
        steps = [0] * (len(ITERATION_BOUNDS) + 1)
        k = 0
        t = start + 10.0
        while t <= start + side.duration_s + 1e-9:
            batch: list[float] = []
            while k < len(mine) and mine[k]["begin"] <= t:
                r = mine[k]
                totals["queries"] += r["input"]
                totals["hits"] += r["cached"]
                totals["prompt"] += r["input"]
                totals["generated"] += r["output"]
                uncached = r["input"] - r["cached"]
                chunk = min(uncached, side.step_tokens_cap)
                batch += [float(chunk)] * max(1, math.ceil(uncached / side.step_tokens_cap))
                batch += [float(rng.randint(4, 24)) for _ in range(r["output"] // 8)]  # decode steps
                k += 1
            steps = [a + b for a, b in zip(steps, _histogram(batch), strict=True)]
            hosts = side.preempting_replicas if side.preempting_replicas is not None else range(side.replicas)
            if replica in hosts:
                totals["preempt"] += side.preemptions / len(hosts) / (side.duration_s / 10.0)
            base = {"time_ns": int(t * NS), "start_time_ns": int(T0 * NS), "service_name": "vllm",
                    "service_version": side.version, "service_instance": host, "host_name": host,
                    "resource_attributes": {"host.name": host}, "attributes": {}}  # fmt: skip
            running = sum(1 for r in mine if r["begin"] <= t < r["end"])
            usage = side.kv_usage if side.kv_per_running is None else side.kv_per_running * running
            for name, kind, value in (
                ("vllm:num_requests_running", "gauge", float(running)),
                ("vllm:kv_cache_usage_perc", "gauge", min(1.0, usage * rng.uniform(0.95, 1.05))),
                ("vllm:prefix_cache_queries", "sum", totals["queries"]),
                ("vllm:prefix_cache_hits", "sum", totals["hits"]),
                ("vllm:prompt_tokens", "sum", totals["prompt"]),
                ("vllm:generation_tokens", "sum", totals["generated"]),
                ("vllm:num_preemptions", "sum", float(round(totals["preempt"]))),
            ):
                rows.append({**base, "name": name, "source_name": name, "kind": kind, "value": value,
                             "is_monotonic": kind == "sum", "temporality": "cumulative" if kind == "sum" else None,
                             "series_key": f"{name}|{host}|{side.version}"})  # fmt: skip
            rows.append({**base, "name": "vllm:iteration_tokens", "source_name": "vllm:iteration_tokens_total",
                         "kind": "histogram", "temporality": "cumulative", "count": sum(steps), "sum": 0.0,
                         "bounds": ITERATION_BOUNDS, "bucket_counts": list(steps),
                         "series_key": f"iter|{host}|{side.version}"})  # fmt: skip
            if latency or waiting:
                queued = sum(1 for r in mine if r["arrival"] <= t < r["begin"])
                rows.append({**base, "name": "vllm:num_requests_waiting", "source_name": "vllm:num_requests_waiting",
                             "kind": "gauge", "value": float(queued),
                             "series_key": f"wait|{host}|{side.version}"})  # fmt: skip
            if latency:
                finished = [r for r in mine if r["end"] <= t]
                done = [r["end"] - r["arrival"] for r in finished]
                # Each finished request's decode steps at its mean inter-token time.
                steps_itl = [((r["end"] - r["first"]) / (r["output"] - 1), r["output"] - 1) for r in finished]
                for name, bounds, observed in (
                    ("vllm:e2e_request_latency_seconds", E2E_BOUNDS, [(d, 1) for d in done]),
                    ("vllm:inter_token_latency_seconds", ITL_BOUNDS, steps_itl),
                ):
                    buckets = [0] * (len(bounds) + 1)
                    for value, weight in observed:
                        buckets[bisect.bisect_left(bounds, value)] += weight
                    rows.append({**base, "name": name, "source_name": name, "kind": "histogram",
                                 "temporality": "cumulative", "count": sum(buckets),
                                 "sum": float(sum(v * w for v, w in observed)), "bounds": bounds,
                                 "bucket_counts": buckets, "series_key": f"{name}|{host}|{side.version}"})  # fmt: skip
            t += 10.0
    return rows


def build(
    path: Path,
    baseline: Side,
    candidate: Side,
    *,
    gateway: bool = False,
    metrics: bool = True,
    cached_on_spans: bool = True,
    engine_spans: bool = True,
    waiting: bool = False,
    seed: int = 7,
) -> Path:
    """Write a store with the baseline window then the candidate window (version change = the deploy).

    ``waiting``: the metric stream carries the waiting-requests gauge even beside engine spans.
    """
    rng = random.Random(seed)
    deploy = T0 + baseline.duration_s
    reqs_b, reqs_c = _simulate(baseline, T0, rng), _simulate(candidate, deploy, rng)
    con = duckdb.connect(str(path))
    try:
        for ddl in (schema.SPANS_DDL, schema.METRIC_POINTS_DDL, schema.DEPLOYS_DDL):
            con.execute(ddl)
        spans = _spans(reqs_b, baseline, gateway, cached_on_spans, rng, engine_spans) + _spans(
            reqs_c, candidate, gateway, cached_on_spans, rng, engine_spans
        )
        con.register("new_spans", to_span_rows(pa.Table.from_pylist(spans, schema=schema.spans_arrow_schema())))
        con.execute("INSERT INTO span_rows BY NAME SELECT * FROM new_spans")
        if metrics:
            # Without engine spans the engines' latency histograms are the latency signal.
            latency = not engine_spans
            points = _metrics(reqs_b, baseline, T0, rng, latency, waiting) + _metrics(
                reqs_c, candidate, deploy, rng, latency, waiting
            )
            con.register("new_points", pa.Table.from_pylist(points, schema=schema.metric_points_arrow_schema()))
            con.execute("INSERT INTO metric_points SELECT * FROM new_points")
        con.execute("INSERT INTO deploys VALUES (?, 'vllm', ?, ?, 'test', NULL)",
                    [int(deploy * NS), candidate.version, baseline.version])  # fmt: skip
    finally:
        con.close()
    return path
