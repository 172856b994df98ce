"""Benchmark: one canary verdict on 1 million engine spans per side (target <= 1 s).

Run: ``python tests/benchmarks/canary.py [--spans-per-side 1000000] [--db PATH]``.
The store is generated in SQL (log-normal TTFT and TPOT, geometric output
lengths, 0.2 % errors; the candidate's TTFT 5 % slower), then one verdict
is timed with six checks (four absolute SLOs, goodput, one relative check),
findings off: the diagnosis is timed separately by its own benchmark.
The last line is ``canary: spans=N seconds=S`` (N counts both sides).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from sre_agent.analysis.selection import Selection
from sre_agent.canary.spec import CanarySpec
from sre_agent.canary.verdict import evaluate
from sre_agent.store.embedded import Store

NS = 1_000_000_000
T0 = 1_780_000_000 * NS

# Box-Muller normal from two uniforms; DuckDB has no normal generator.
_NORMAL = "sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())"


def build(path: Path, per_side: int) -> None:
    """Write ``per_side`` v1 and v2 engine spans into a new store at ``path``."""
    with Store.open(path) as store:
        con = store.connection
        con.execute("SELECT setseed(0.42)")
        for version, ttft_scale, offset in (("v1", 1.0, 0), ("v2", 1.05, per_side)):
            con.execute(
                f"""
                INSERT INTO span_rows (trace_id, span_id, name, kind, start_ns, end_ns, duration_s, status_code,
                                   service_name, service_version, is_engine, model, input_tokens, output_tokens,
                                   queue_s, ttft_s, decode_s, e2e_s, tpot_s)
                SELECT printf('%032x', i + {offset}), printf('%016x', i + {offset}), 'llm_request', 'server',
                       {T0} + i * 600, {T0} + i * 600 + CAST(e2e * 1e9 AS BIGINT), e2e,
                       CASE WHEN err THEN 'error' ELSE 'unset' END, 'vllm', '{version}', TRUE, 'llama',
                       500, out_tokens, queue, ttft, tpot * (out_tokens - 1), e2e, tpot
                FROM (
                    SELECT i, ttft, tpot, out_tokens, queue, queue + ttft + tpot * (out_tokens - 1) AS e2e, err
                    FROM (
                        SELECT i,
                               {ttft_scale} * exp(ln(0.35) + 0.45 * ({_NORMAL})) AS ttft,
                               exp(ln(0.03) + 0.15 * ({_NORMAL})) AS tpot,
                               1 + CAST(floor(-200 * ln(1 - random())) AS BIGINT) AS out_tokens,
                               CASE WHEN random() < 0.8 THEN 0.001 ELSE -0.05 * ln(1 - random()) END AS queue,
                               random() < 0.002 AS err
                        FROM range({per_side}) r(i)
                    )
                )
                """
            )
        con.execute("CHECKPOINT")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--spans-per-side", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, help="store file to create (default: a temporary file)")
    parser.add_argument("--repeat", type=int, default=3, help="timed verdicts; the median is reported")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "canary-bench.duckdb"
        started = time.perf_counter()
        build(path, args.spans_per_side)
        print(f"built {2 * args.spans_per_side} spans in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        spec = CanarySpec.from_strings(
            ["ttft_p99=5s", "itl_p99=80ms", "e2e_p99=60s", "error_rate=1%", "goodput=0.95"],
            ["ttft_p99=15%"],
            findings=0,
        )
        selection = Selection(mode="versions", baseline_version="v1", candidate_version="v2")
        timings, cpu = [], []
        with Store.open(path, read_only=True) as store:
            for _ in range(args.repeat):
                started, started_cpu = time.perf_counter(), time.process_time()
                verdict = evaluate(store.connection, selection, spec)
                timings.append(time.perf_counter() - started)
                cpu.append(time.process_time() - started_cpu)
        for check in verdict.slos:
            print(f"  {check.name:<22} {check.status:<13} {check.reason}", file=sys.stderr)
        print(
            f"verdict {verdict.verdict}; wall {', '.join(f'{t:.3f}' for t in timings)} s; "
            f"CPU (all threads) {', '.join(f'{t:.3f}' for t in cpu)} s; load average {os.getloadavg()[0]:.1f}",
            file=sys.stderr,
        )
        seconds = sorted(timings)[len(timings) // 2]
        print(f"canary: spans={2 * args.spans_per_side} seconds={seconds:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
