"""Run the real-engine incidents and print one line per incident (the opt-in command; see docs/real-engine.md).

    .venv/bin/python tests/real/run_incidents.py                      # all five, ~32 min on 2 cores
    .venv/bin/python tests/real/run_incidents.py --incident kv_cache_cut --seconds 30

The last line is ``correct N/5``. Stores and engine logs stay under
``~/.cache/sre-agent-real/runs/`` as the evidence.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_engine import INCIDENTS, IncidentResult, Workload, run_incident, workdir_for


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def _short(text: str | None, limit: int = 60) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summary_line(result: IncidentResult) -> str:
    """``incident | expected | top-1 | TTFT p99 ratio | e2e p99 ratio | engine counters``, Markdown."""
    raw = result.raw
    base, cand = raw[result.sides[0].version], raw[result.sides[1].version]

    def rate(side: dict[str, float | None]) -> str:
        hits, queries = side.get("prefix_cache_hits"), side.get("prefix_cache_queries")
        if not queries:
            return "– (no queries: caching off)" if queries == 0 else "–"
        return _fmt(hits / queries if hits is not None else None)

    engine = (
        f"hit rate {rate(base)} → {rate(cand)}; preemptions {_fmt(base['num_preemptions'], '.0f')} → "
        f"{_fmt(cand['num_preemptions'], '.0f')}; running max {_fmt(base['running_max'], '.0f')} → "
        f"{_fmt(cand['running_max'], '.0f')}; waiting max {_fmt(base['waiting_max'], '.0f')} → "
        f"{_fmt(cand['waiting_max'], '.0f')}; requests {base['requests']} → {cand['requests']}"
    )
    return (
        f"| {result.incident.name} ({result.incident.note}) | {'/'.join(result.incident.expected)} | "
        f"{result.top1 or 'no finding'} {'✓' if result.correct else '✗'} | {_short(result.top1_since_last_deploy)} | "
        f"{_fmt(raw['ttft_p99_ratio'])}× | {_fmt(raw['e2e_p99_ratio'])}× | {engine} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--incident", action="append", choices=[i.name for i in INCIDENTS])
    parser.add_argument("--seconds", type=float, default=Workload.seconds, help="traffic per side, seconds")
    parser.add_argument("--rate-scale", type=float, default=Workload.rate_scale, help="arrival-rate multiplier")
    parser.add_argument("--json", type=Path, help="also write every result's figures here")
    args = parser.parse_args()
    chosen = [i for i in INCIDENTS if args.incident is None or i.name in args.incident]
    workload = Workload(seconds=args.seconds, rate_scale=args.rate_scale)
    print(
        "| incident | expected | top-1 (traffic windows) | top-1 (--since-last-deploy) | TTFT p99 | e2e p99 "
        "| engine /metrics (scraped) |"
    )
    print("|---|---|---|---|---|---|---|", flush=True)
    results = []
    with workdir_for("incidents") as workdir:
        for incident in chosen:
            result = run_incident(incident, workdir, workload)
            results.append(result)
            print(summary_line(result), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {"incident": r.incident.name, "top1": r.top1, "top1_since_last_deploy": r.top1_since_last_deploy,
                     "raw": r.raw, "findings": r.findings[:3], "db": str(r.db),
                     "drive": [vars(s.drive) for s in r.sides], "startup_s": [s.startup_s for s in r.sides]}
                    for r in results
                ],
                indent=1,
                default=str,
            )
        )  # fmt: skip
    print(f"stores and logs: {workdir}")
    print(f"correct {sum(r.correct for r in results)}/{len(results)}")
    return 0 if all(r.correct for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
