"""``sre-agent demo``: replay a bundled incident into an embedded DuckDB, then diagnose it.

No server and no network: the scenario ``prefix_cache_disabled`` (a deploy
that turns prefix caching off) is simulated, its spans and metrics go
through the same decoder as ``sre-agent ingest`` into a DuckDB file, and the
diagnosis of the deploy is printed. If the diagnosis engine cannot be
imported, a before/after latency table per stage (computed in DuckDB SQL)
is printed instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEMO_SCENARIO = "prefix_cache_disabled"

EPILOG = """examples:
  sre-agent demo                              replay the bundled incident and print the diagnosis
  sre-agent demo --format markdown            the same, as Markdown
  sre-agent demo --db demo.duckdb             keep the store afterwards (then: sre-agent tui --db demo.duckdb)
"""

# (label, SQL expression over the spans table, filter)
_STAGES: tuple[tuple[str, str, str], ...] = (
    ("queue", "queue_s", "is_engine"),
    ("ttft", "ttft_s", "is_engine"),
    ("prefill", "prefill_s", "is_engine"),
    ("tpot", "tpot_s", "is_engine"),
    ("decode", "decode_s", "is_engine"),
    ("engine e2e", "e2e_s", "is_engine"),
    ("gateway e2e", "duration_s", "service_name = 'llm-gateway' AND kind = 'server'"),
    (
        "dependency",
        "duration_s",
        "service_name = 'llm-gateway' AND kind = 'client' AND attributes['peer.service'] IS NOT NULL",
    ),
)


def register(subparsers: Any) -> None:
    """Add the ``demo`` command."""
    parser = subparsers.add_parser(
        "demo",
        help="replay a built-in incident into an embedded store and diagnose it",
        description=(
            "Simulate a vLLM fleet behind a gateway (real Azure conversation traffic), deploy a release that "
            "turns prefix caching off, store the telemetry in an embedded DuckDB and diagnose the deploy. "
            "Needs no server and no network."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", metavar="PATH", help="store file to create (default: a temporary file)")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text", help="output format")
    # Replays a fraction of the incident (tests); not part of the documented interface.
    parser.add_argument("--scale", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def stage_table(con: Any, deploy_ns: int, window_ns: int) -> list[dict[str, Any]]:
    """p50/p99 per stage before and after ``deploy_ns`` (each side ``window_ns`` long), from the spans table."""
    rows = []
    for label, column, where in _STAGES:
        sql = f"""
            SELECT start_ns >= ? AS after,
                   quantile_cont({column}, 0.5) AS p50, quantile_cont({column}, 0.99) AS p99, count(*) AS n
            FROM spans
            WHERE {where} AND {column} IS NOT NULL AND start_ns >= ? AND start_ns < ?
            GROUP BY 1
        """
        result = {
            bool(after): (p50, p99, n)
            for after, p50, p99, n in con.execute(
                sql, [deploy_ns, deploy_ns - window_ns, deploy_ns + window_ns]
            ).fetchall()
        }
        before = result.get(False, (None, None, 0))
        after = result.get(True, (None, None, 0))
        rows.append({"stage": label, "before": before, "after": after})
    return rows


def _render_table(rows: list[dict[str, Any]], fmt: str) -> str:
    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if not a or b is None else f"{b / a:.2f}x"

    if fmt == "json":
        import json

        return json.dumps(
            [
                {
                    "stage": r["stage"],
                    "before": {"p50": r["before"][0], "p99": r["before"][1], "n": r["before"][2]},
                    "after": {"p50": r["after"][0], "p99": r["after"][1], "n": r["after"][2]},
                }
                for r in rows
            ],
            indent=2,
        )
    lines = []
    if fmt == "markdown":
        lines.append("| stage | p50 before (s) | p50 after (s) | p99 before (s) | p99 after (s) | p99 change |")
        lines.append("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            (b50, b99, _), (a50, a99, _) = r["before"], r["after"]
            lines.append(f"| {r['stage']} | {num(b50)} | {num(a50)} | {num(b99)} | {num(a99)} | {ratio(b99, a99)} |")
    else:
        lines.append(
            f"{'stage':14s} {'p50 before':>11s} {'p50 after':>10s} {'p99 before':>11s} {'p99 after':>10s} {'p99':>7s}"
        )
        for r in rows:
            (b50, b99, _), (a50, a99, _) = r["before"], r["after"]
            cells = (num(b50), num(a50), num(b99), num(a99), ratio(b99, a99))
            lines.append(
                f"{r['stage']:14s} {cells[0]:>11s} {cells[1]:>10s} {cells[2]:>11s} {cells[3]:>10s} {cells[4]:>7s}"
            )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Replay with a progress bar on stderr, then print the diagnosis (or the stage table) on stdout."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sre_agent.replays.outputs import StoreOutput
    from sre_agent.replays.replay import epoch_ns, replay
    from sre_agent.replays.scenario import load_scenario
    from sre_agent.store.embedded import Store

    scenario = load_scenario(DEMO_SCENARIO)
    if args.scale != 1.0:
        scenario = scenario.scaled(args.scale)
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if args.db:
        db_path = Path(args.db)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="sre-agent-demo-")
        db_path = Path(tmp.name) / "demo.duckdb"
    try:
        store = Store.open(db_path)
        output = StoreOutput(store)
        progress = Progress(
            TextColumn("[bold]replaying[/] {task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} s simulated"),
            TimeElapsedColumn(),
            console=_stderr_console(),
            transient=False,
        )
        with progress:
            task = progress.add_task(scenario.name, total=scenario.workload.duration_s)
            result = replay(scenario, output, progress=lambda t: progress.update(task, completed=t))
            progress.update(task, completed=scenario.workload.duration_s)
        print(
            f"{len(result.records)} requests, {output.spans_written} spans and {output.points_written} metric points "
            f"stored in {result.wall_s:.1f} s ({db_path})",
            file=sys.stderr,
        )
        deploy_ns = epoch_ns(scenario) + int(scenario.deploy.at_s * 1e9)
        window_ns = int(scenario.deploy.at_s * 1e9)
        print(
            f"deploy of {scenario.deploy.new_version} at +{scenario.deploy.at_s:.0f} s; diagnosing...", file=sys.stderr
        )
        try:
            text = _diagnosis(store, deploy_ns, window_ns, args.format)
        except ImportError as exc:
            log.debug("diagnosis unavailable: %s", exc)
            text = _render_table(stage_table(store.connection, deploy_ns, window_ns), args.format)
        store.close()
        print(text)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


def _diagnosis(store: Any, deploy_ns: int, window_ns: int, fmt: str) -> str:
    from sre_agent.analysis.diagnosis import diagnose
    from sre_agent.analysis.selection import Selection

    report = diagnose(store, Selection(mode="deploy_at", deploy_at_ns=deploy_ns, window_ns=window_ns))
    rendered: str = report.render(fmt)  # type: ignore[arg-type]
    return rendered


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(file=sys.stderr)
