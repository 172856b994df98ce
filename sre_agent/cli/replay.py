"""``sre-agent replay``: run a scenario through the engine simulator and send its telemetry somewhere."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from sre_agent.errors import UsageError

EPILOG = """examples:
  sre-agent replay --list                                     the bundled scenarios and their expected causes
  sre-agent replay prefix_cache_disabled --out incident.jsonl.gz   collector-style JSON lines
  sre-agent replay kv_pressure_fewer_blocks --db incident.duckdb   straight into a store
  sre-agent replay load_rate_up_at_deploy --endpoint http://127.0.0.1:4318 --speed 20
"""

# Longest replay, as a multiple of the scenario's duration: far beyond it a typo runs for hours.
MAX_SCALE = 10.0

SUMMARY_METRICS = (
    "e2e_p50",
    "e2e_p99",
    "ttft_p50",
    "ttft_p99",
    "tpot_p99",
    "queue_p99",
    "dependency_p99",
    "error_rate",
    "attempts_per_request",
)


def register(subparsers: Any) -> None:
    """Add the ``replay`` command."""
    parser = subparsers.add_parser(
        "replay",
        help="replay a scenario (simulated vLLM fleet) and emit its telemetry",
        description=(
            "Replay a scenario file (replays/scenarios/*.toml, or a path) through the discrete-event vLLM "
            "simulator and write its OpenTelemetry spans and metrics to a file, an OTLP endpoint or a store. "
            "Prints the before/after figures the scenario claims."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", nargs="?", help="scenario name (see --list) or path to a .toml file")
    parser.add_argument("--list", action="store_true", help="list the bundled scenarios and exit")
    sink = parser.add_mutually_exclusive_group()
    sink.add_argument("--out", metavar="FILE", help="write OTLP JSON lines (.jsonl or .jsonl.gz)")
    sink.add_argument("--endpoint", metavar="URL", help="OTLP endpoint: http://HOST:4318 or grpc://HOST:4317")
    sink.add_argument("--db", metavar="PATH", help="append into this DuckDB store file")
    parser.add_argument("--speed", type=float, metavar="X", help="pace at X times real time, timestamps from now")
    parser.add_argument("--scale", type=float, default=1.0, metavar="F", help="replay F of the scenario's duration")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="summary format (default: text)")
    parser.set_defaults(func=run)


def _list() -> int:
    from sre_agent.replays.scenario import list_scenarios, load_scenario

    for path in list_scenarios():
        sc = load_scenario(path)
        scope = ",".join(f"{k}={v}" for k, v in sc.expected.scope.items()) or "-"
        print(f"{path.stem:40s} {sc.expected.cause:20s} {scope}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Replay, then print the summary on stdout."""
    if args.list:
        return _list()
    if not args.scenario:
        raise UsageError("replay: give a SCENARIO (or --list)")
    if args.speed is not None and not (0 < args.speed < math.inf):
        raise UsageError("--speed must be a positive number")
    if not 0 < args.scale <= MAX_SCALE:
        raise UsageError(f"--scale must be above 0 and at most {MAX_SCALE:g}")
    from sre_agent.replays.outputs import JsonLinesOutput, OtlpEndpointOutput, StoreOutput, TelemetryOutput
    from sre_agent.replays.replay import replay
    from sre_agent.replays.scenario import load_scenario

    scenario = load_scenario(args.scenario)
    if args.scale != 1.0:
        scenario = scenario.scaled(args.scale)
    output: TelemetryOutput | None = None
    if args.out:
        output = JsonLinesOutput(args.out)
    elif args.endpoint:
        output = OtlpEndpointOutput(args.endpoint)
    elif args.db:
        output = StoreOutput.open(args.db)
    result = replay(scenario, output, speed=args.speed)
    rows = []
    for metric in SUMMARY_METRICS:
        base, cand, change = result.compare(metric, dict(scenario.expected.scope))
        rows.append({"metric": metric, "baseline": base, "candidate": cand, "change": change})
    summary = {
        "scenario": scenario.name,
        "requests": len(result.records),
        "sim_seconds": result.sim_s,
        "wall_seconds": round(result.wall_s, 3),
        "deploy_at_s": scenario.deploy.at_s,
        "expected": {"cause": scenario.expected.cause, "scope": dict(scenario.expected.scope)},
        "metrics": rows,
    }
    if isinstance(output, StoreOutput | OtlpEndpointOutput):
        summary["rejected"] = getattr(output, "rejected", 0)
        summary["failed_batches"] = getattr(output, "failed_batches", 0)
    if args.format == "json":
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{scenario.name}: {len(result.records)} requests, {result.sim_s:.0f} s simulated in {result.wall_s:.1f} s")
    scope = ", ".join(f"{k}={v}" for k, v in scenario.expected.scope.items())
    print(f"expected cause: {scenario.expected.cause}" + (f" (scope {scope})" if scope else ""))
    print(f"{'metric':24s} {'before':>10s} {'after':>10s} {'change':>8s}")
    for row in rows:
        print(f"{row['metric']:24s} {row['baseline']:10.4f} {row['candidate']:10.4f} {row['change']:8.3f}")
    if output is not None and args.out:
        print(f"telemetry written to {args.out}", file=sys.stderr)
    return 0
