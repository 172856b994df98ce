"""Benchmark: one hour of the Azure conversation trace (19,366 requests) on 4 simulated vLLM replicas,
telemetry included (every span and 5-second metric scrape built and written as OTLP JSON lines).

Run from the repository root (needs ../shared/data/traces):

    python tests/benchmarks/simulate.py [--profile llama3-8b-h100] [--out /tmp/simulate.jsonl]

Last line: ``simulate: requests=N sim_seconds=S wall_seconds=W speedup=S/W``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

from sre_agent.replays.outputs import JsonLinesOutput
from sre_agent.replays.replay import replay
from sre_agent.replays.scenario import load_scenario
from sre_agent.replays.workload import load_trace

TRACE = (
    Path(__file__).resolve().parents[2].parent
    / "shared"
    / "data"
    / "traces"
    / "azure-llm-2023"
    / ("AzureLLMInferenceTrace_conv.csv")
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--out", help="JSON-lines file to write (default: a temporary file)")
    args = parser.parse_args()

    rows = load_trace(str(TRACE))
    base = load_scenario("none_version_bump")
    duration = rows[-1].arrival_s + 0.001  # exactly the trace: every row once, no wrap-around
    scenario = dataclasses.replace(
        base,
        workload=dataclasses.replace(base.workload, trace=str(TRACE), duration_s=duration, loop_s=None),
        replicas=args.replicas,
        profile=args.profile,
        deploy=dataclasses.replace(base.deploy, at_s=duration / 2),
    )
    with tempfile.TemporaryDirectory() as tmp:
        out_path = Path(args.out) if args.out else Path(tmp) / "simulate.jsonl"
        output = JsonLinesOutput(out_path)
        started = time.perf_counter()
        result = replay(scenario, output)
        wall = time.perf_counter() - started
        size_mb = out_path.stat().st_size / 1e6
    spans = sum(1 + len(r.deps) + len(r.attempts) + len(r.engine_spans) for r in result.records)
    cpu = time.process_time()
    print(f"profile={args.profile} replicas={args.replicas} spans={spans} lines={output.lines} size_mb={size_mb:.1f}")
    print(f"process_cpu_seconds={cpu:.2f} (speedup on CPU time: {duration / cpu:.1f})")
    print(
        f"simulate: requests={len(result.records)} sim_seconds={duration:.1f} wall_seconds={wall:.2f} "
        f"speedup={duration / wall:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
