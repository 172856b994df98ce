"""Small synthetic stores built from serving mechanics, for diagnose tests.

Each replica is a FIFO queue with ``slots`` concurrent requests (continuous
batching reduced to its queueing essence): a request waits until a slot
frees, then takes prefill (uncached prompt tokens x seconds per token) plus
decode (output tokens x TPOT x the host's slowdown). More arrivals at the same
service time therefore queue more; fewer replicas likewise; a slow host slows
only its own requests. Tables are created from ``sre_agent.store.schema``'s DDL.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from sre_agent.store import schema
from sre_agent.store.span_rows import to_span_rows

T0_NS = 1_790_000_000 * 1_000_000_000
# vLLM's default buckets
E2E_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
NS = 1_000_000_000


@dataclass
class Side:
    """One window's workload and serving configuration."""

    version: str = "v1"
    rate_rps: float = 20.0
    duration_s: float = 600.0
    replicas: int = 4
    slots: int = 16
    prefill_s_per_token: float = 2e-4
    tpot_s: float = 0.02
    input_mean: float = 600.0
    output_mean: float = 120.0
    cache_hit: float = 0.5
    tenants: dict[str, float] = field(default_factory=lambda: {"acme": 0.5, "globex": 0.5})
    tenant_input_scale: dict[str, float] = field(default_factory=dict)
    slow_hosts: dict[str, float] = field(default_factory=dict)
    dependency_s: float = 0.05
    dependency_tail: float = 0.0  # probability of a 20x slower dependency call
    malformed: int = 0  # rows with negative / NaN latencies
    # Time-correlated noise: the running batch swings with bursts of arrivals, so every request's
    # TPOT shares a slowly varying factor exp(x), x an Ornstein-Uhlenbeck process with this standard
    # deviation and correlation time (seconds). 0 = no such noise.
    tpot_drift: float = 0.0
    tpot_drift_s: float = 60.0


@dataclass
class Options:
    """What telemetry the store gets."""

    engine_spans: bool = True
    gateway_spans: bool = False
    metrics: bool = True
    deploy_marker: bool = True
    clock_skew_s: float = 0.0  # engine clocks ahead of the gateway's
    # Both versions serve at once (a canary split): the candidate starts this many seconds after the
    # baseline instead of when the baseline's window ends. None = a hot swap at the window boundary.
    concurrent_after_s: float | None = None
    # The candidate's first request comes this many seconds after the deploy (a restart's start-up).
    restart_gap_s: float = 0.0
    seed: int = 1


def _lognormal(rng: random.Random, mean: float, sigma: float = 0.6) -> float:
    return math.exp(rng.gauss(math.log(mean) - sigma * sigma / 2, sigma))


def _simulate(side: Side, start_s: float, rng: random.Random) -> list[dict[str, object]]:
    tenants = list(side.tenants)
    weights = [side.tenants[t] for t in tenants]
    free = {r: [start_s] * side.slots for r in range(side.replicas)}
    for heap in free.values():
        heapq.heapify(heap)
    t = start_s
    out: list[dict[str, object]] = []
    drift = rng.gauss(0.0, side.tpot_drift) if side.tpot_drift > 0 else 0.0
    while True:
        step = rng.expovariate(side.rate_rps)
        t += step
        if t >= start_s + side.duration_s:
            break
        if side.tpot_drift > 0:
            decay = math.exp(-step / side.tpot_drift_s)
            drift = drift * decay + side.tpot_drift * math.sqrt(1 - decay * decay) * rng.gauss(0.0, 1.0)
        replica = rng.randrange(side.replicas)
        host = f"gpu-{replica}"
        tenant = rng.choices(tenants, weights)[0]
        inp = max(1, int(_lognormal(rng, side.input_mean * side.tenant_input_scale.get(tenant, 1.0))))
        outp = max(2, int(_lognormal(rng, side.output_mean)))
        cached = int(inp * side.cache_hit * rng.uniform(0.6, 1.0))
        begin = max(t, heapq.heappop(free[replica]))
        prefill = (inp - cached) * side.prefill_s_per_token * rng.uniform(0.9, 1.1)
        decode = (outp - 1) * side.tpot_s * side.slow_hosts.get(host, 1.0) * rng.uniform(0.9, 1.1) * math.exp(drift)
        end = begin + prefill + decode
        heapq.heappush(free[replica], end)
        out.append(
            {
                "arrival": t,
                "begin": begin,
                "end": end,
                "host": host,
                "tenant": tenant,
                "input": inp,
                "output": outp,
                "cached": cached,
                "prefill": prefill,
                "decode": decode,
                "version": side.version,
            }
        )
    return out


def _span_rows(reqs: list[dict[str, object]], side: Side, opts: Options, rng: random.Random) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    skew = int(opts.clock_skew_s * NS)
    for i, r in enumerate(reqs):
        trace = f"{rng.getrandbits(128):032x}"
        arrival, begin, end = float(r["arrival"]), float(r["begin"]), float(r["end"])  # type: ignore[arg-type]
        queue, prefill, decode = begin - arrival, float(r["prefill"]), float(r["decode"])  # type: ignore[arg-type]
        e2e = end - arrival
        host = str(r["host"])
        engine_parent = None
        dep = 0.0
        if opts.gateway_spans:
            dep = side.dependency_s * rng.uniform(0.8, 1.2) * (20 if rng.random() < side.dependency_tail else 1)
            root, attempt_id = f"{rng.getrandbits(64):016x}", f"{rng.getrandbits(64):016x}"
            g0 = arrival - dep - 0.002
            common = {
                "trace_id": trace,
                "status_code": "unset",
                "is_engine": False,
                "service_name": "llm-gateway",
                "service_version": "g1",
                "tenant_id": r["tenant"],
                "model": "llama-70b",
            }
            attrs = {
                "tenant.id": str(r["tenant"]),
                "http.route": "/v1/chat/completions",
                "gen_ai.request.model": "llama-70b",
            }
            res = {"service.name": "llm-gateway", "service.version": "g1"}
            rows.append(
                {
                    **common,
                    "span_id": root,
                    "parent_span_id": None,
                    "name": "POST /v1/chat/completions",
                    "kind": "server",
                    "start_ns": int(g0 * NS),
                    "end_ns": int((end + 0.003) * NS),
                    "duration_s": end + 0.003 - g0,
                    "attributes": attrs,
                    "resource_attributes": res,
                }
            )
            rows.append(
                {
                    **common,
                    "span_id": f"{rng.getrandbits(64):016x}",
                    "parent_span_id": root,
                    "name": "retrieval",
                    "kind": "client",
                    "start_ns": int(g0 * NS),
                    "end_ns": int((g0 + dep) * NS),
                    "duration_s": dep,
                    "attributes": {"peer.service": "retrieval"},
                    "resource_attributes": res,
                }
            )
            rows.append(
                {
                    **common,
                    "span_id": attempt_id,
                    "parent_span_id": root,
                    "name": "POST",
                    "kind": "client",
                    "start_ns": int(arrival * NS),
                    "end_ns": int(end * NS),
                    "duration_s": e2e,
                    "attributes": {"server.address": host},
                    "resource_attributes": res,
                }
            )
            engine_parent = attempt_id
        if not opts.engine_spans:
            continue
        bad = i < side.malformed
        rows.append(
            {
                "trace_id": trace,
                "span_id": f"{rng.getrandbits(64):016x}",
                "parent_span_id": engine_parent,
                "name": "llm_request",
                "kind": "server",
                "start_ns": int(arrival * NS) + skew,
                "end_ns": int(end * NS) + skew,
                "duration_s": e2e,
                "status_code": "unset",
                "service_name": "vllm",
                "service_version": r["version"],
                "service_instance": host,
                "host_name": host,
                "tenant_id": None if opts.gateway_spans else r["tenant"],
                "is_engine": True,
                "model": "llama-70b",
                "request_id": f"req-{i}",
                "input_tokens": r["input"],
                "output_tokens": r["output"],
                "cached_tokens": r["cached"],
                "queue_s": -1.0 if bad else queue,
                "ttft_s": float("nan") if bad else queue + prefill,
                "prefill_s": prefill,
                "decode_s": decode,
                "inference_s": prefill + decode,
                "e2e_s": -5.0 if bad else e2e,
                "tpot_s": decode / (int(r["output"]) - 1),
                "finish_reason": "stop",  # type: ignore[call-overload]
                "attempt": 0,
                "resource_attributes": {
                    "host.name": host,
                    "service.instance.id": host,
                    "service.name": "vllm",
                    "service.version": str(r["version"]),
                },
                "attributes": {}
                if opts.gateway_spans
                else {"tenant.id": str(r["tenant"]), "gen_ai.request.model": "llama-70b"},
            }
        )
    return rows


def _metric_rows(reqs: list[dict[str, object]], side: Side, start_s: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for replica in range(side.replicas):
        host = f"gpu-{replica}"
        mine = [r for r in reqs if r["host"] == host]
        begins = sorted(float(r["begin"]) for r in mine)  # type: ignore[arg-type]
        ends = sorted(float(r["end"]) for r in mine)  # type: ignore[arg-type]
        arrivals = sorted(float(r["arrival"]) for r in mine)  # type: ignore[arg-type]
        queries = hits = 0.0
        done = sorted(mine, key=lambda r: float(r["begin"]))  # type: ignore[arg-type]
        k = 0
        finished = sorted(mine, key=lambda r: float(r["end"]))  # type: ignore[arg-type]
        f = 0
        e2e_counts = [0] * (len(E2E_BOUNDS) + 1)
        ttft_counts = [0] * (len(TTFT_BOUNDS) + 1)
        e2e_sum = ttft_sum = 0.0
        t = start_s + 5.0
        while t < start_s + side.duration_s:
            running = bisect.bisect_right(begins, t) - bisect.bisect_right(ends, t)
            waiting = bisect.bisect_right(arrivals, t) - bisect.bisect_right(begins, t)
            while k < len(done) and float(done[k]["begin"]) <= t:  # type: ignore[arg-type]
                queries += float(done[k]["input"])  # type: ignore[arg-type]
                hits += float(done[k]["cached"])  # type: ignore[arg-type]
                k += 1
            while f < len(finished) and float(finished[f]["end"]) <= t:  # type: ignore[arg-type]
                r = finished[f]
                e2e = float(r["end"]) - float(r["arrival"])  # type: ignore[arg-type]
                ttft = float(r["begin"]) + float(r["prefill"]) - float(r["arrival"])  # type: ignore[arg-type]
                e2e_counts[bisect.bisect_left(E2E_BOUNDS, e2e)] += 1
                ttft_counts[bisect.bisect_left(TTFT_BOUNDS, ttft)] += 1
                e2e_sum += e2e
                ttft_sum += ttft
                f += 1
            base = {
                "time_ns": int(t * NS),
                "service_name": "vllm",
                "service_version": side.version,
                "service_instance": host,
                "host_name": host,
                "model": "llama-70b",
                "resource_attributes": {"host.name": host},
                "attributes": {"model_name": "llama-70b"},
            }
            for name, kind, value in (
                ("vllm:num_requests_running", "gauge", float(running)),
                ("vllm:num_requests_waiting", "gauge", float(waiting)),
                ("vllm:kv_cache_usage_perc", "gauge", min(1.0, running / (side.slots * 1.2))),
                ("vllm:prefix_cache_queries", "sum", queries),
                ("vllm:prefix_cache_hits", "sum", hits),
            ):
                rows.append(
                    {
                        **base,
                        "name": name,
                        "source_name": name,
                        "kind": kind,
                        "value": value,
                        "is_monotonic": kind == "sum",
                        "temporality": "cumulative" if kind == "sum" else None,
                        "series_key": f"{name}|{host}",
                    }
                )
            for name, bounds, counts, total in (
                ("vllm:e2e_request_latency_seconds", E2E_BOUNDS, e2e_counts, e2e_sum),
                ("vllm:time_to_first_token_seconds", TTFT_BOUNDS, ttft_counts, ttft_sum),
            ):
                rows.append(
                    {
                        **base,
                        "name": name,
                        "source_name": name,
                        "kind": "histogram",
                        "value": None,
                        "temporality": "cumulative",
                        "count": sum(counts),
                        "sum": total,
                        "bounds": list(bounds),
                        "bucket_counts": list(counts),
                        "series_key": f"{name}|{host}",
                    }
                )
            t += 10.0
    return rows


def build_store(path: Path, baseline: Side, candidate: Side, opts: Options | None = None) -> int:
    """Write a store at ``path``; returns the deploy time (ns) between the two windows."""
    opts = opts or Options()
    rng = random.Random(opts.seed)
    t0 = T0_NS / NS
    deploy_s = t0 + (baseline.duration_s if opts.concurrent_after_s is None else opts.concurrent_after_s)
    reqs_b = _simulate(baseline, t0, rng)
    serving_s = deploy_s + opts.restart_gap_s
    reqs_c = _simulate(candidate, serving_s, rng)
    con = duckdb.connect(str(path))
    try:
        con.execute(schema.SPANS_DDL)
        con.execute(schema.METRIC_POINTS_DDL)
        con.execute(schema.DEPLOYS_DDL)
        spans = _span_rows(reqs_b, baseline, opts, rng) + _span_rows(reqs_c, candidate, opts, rng)
        if spans:
            table = pa.Table.from_pylist(spans, schema=schema.spans_arrow_schema())
            con.register("new_spans", to_span_rows(table))
            con.execute("INSERT INTO span_rows BY NAME SELECT * FROM new_spans")
            con.unregister("new_spans")
        if opts.metrics:
            points = _metric_rows(reqs_b, baseline, t0) + _metric_rows(reqs_c, candidate, serving_s)
            table = pa.Table.from_pylist(points, schema=schema.metric_points_arrow_schema())
            con.register("new_points", table)
            con.execute("INSERT INTO metric_points SELECT * FROM new_points")
            con.unregister("new_points")
        if opts.deploy_marker:
            con.execute(
                "INSERT INTO deploys VALUES (?, 'vllm', ?, ?, 'test', NULL)",
                [int(deploy_s * NS), candidate.version, baseline.version],
            )
    finally:
        con.close()
    return int(deploy_s * NS)
