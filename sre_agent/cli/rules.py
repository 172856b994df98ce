"""``sre-agent rules``: list the installed diagnosis rules (reads metadata; imports no rule)."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register"]

EPILOG = """Rules register under the entry-point group "sre_agent.rules" (built-in and
third-party alike); see sre_agent.analysis.rules_api for how to write one.

examples:
  sre-agent rules
  sre-agent rules --check          also import each rule and report those that fail
  sre-agent rules --format json
"""


def register(subparsers: Any) -> None:
    """Add the ``rules`` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rules",
        help="list installed diagnosis rules",
        description="List the diagnosis rules installed through the sre_agent.rules entry-point group.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="import each rule and report load failures")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the registry in order; with ``--check`` also load every rule."""
    from sre_agent.analysis.rules_registry import list_rules, load_rules

    infos = list_rules()
    failures = {f.name: f.error for f in load_rules()[1]} if args.check else {}
    if args.format == "json":
        rows = [{"name": i.name, "target": i.target, "distribution": i.distribution} for i in infos]
        for row in rows:
            if args.check:
                row["error"] = failures.get(str(row["name"]))
        print(json.dumps({"rules": rows}, indent=2))
        return 0
    width = max((len(i.name) for i in infos), default=4)
    for info in infos:
        status = f"  FAILED: {failures[info.name]}" if info.name in failures else ""
        print(f"{info.name:{width}s}  {info.target}  ({info.distribution or 'unknown'}){status}")
    if not infos:
        print("no rules installed (is the package installed? pip install -e .)")
    return 0
