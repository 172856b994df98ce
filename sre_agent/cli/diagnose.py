"""``sre-agent diagnose``: which latency regressed, where, and why (exit 0, or 2 on usage errors)."""

from __future__ import annotations

import argparse
from typing import Any

from sre_agent.cli._common import (
    add_format_option,
    add_selection_options,
    add_store_options,
    config_from_args,
    selection_from_args,
)

__all__ = ["register"]

EPILOG = """The report ranks causes from a closed vocabulary (prefix_cache, batch_composition,
kv_pressure, capacity, load, traffic_mix, dependency, decode_slowdown, prefill_slowdown,
retry_amplification, errors; none when nothing regressed), each with a score, evidence
and the next check. Latency quantiles carry 95% confidence intervals over time blocks.

exit codes: 0 report written (whatever it says), 2 usage error or a selection without data,
            1 store or server error

examples:
  sre-agent diagnose --db ./sre-agent.duckdb --since-last-deploy
  sre-agent diagnose --deploy-at 2026-12-02T14:00:00Z --window 30m --format markdown
  sre-agent diagnose --baseline-version v1 --candidate-version v2 --where gen_ai.request.model=llama-70b
  sre-agent diagnose --url http://127.0.0.1:4318 --since-last-deploy --format json
  sre-agent diagnose --store clickhouse://default@clickhouse:8123/otel --deploy-at 2026-12-02T14:00:00Z
"""


def register(subparsers: Any) -> None:
    """Add the ``diagnose`` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "diagnose",
        help="ranked diagnosis of a latency regression",
        description="Compare baseline and candidate request populations and explain which latency "
        "regressed, by how much, in which stage and slice, and why.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_options(parser, read_store=True)
    add_selection_options(parser)
    parser.add_argument("--rule", metavar="NAME", action="append", default=None, help="run only this rule (repeatable)")
    add_format_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Diagnose locally (``--db``) or through a server (``--url``) and print the report."""
    selection = selection_from_args(args)
    config = config_from_args(args)
    if config.url:
        import json

        from sre_agent.api.client import post_json
        from sre_agent.errors import RemoteError, UsageError

        payload: dict[str, Any] = {"selection": selection.to_dict()}
        if args.rule:
            payload["rules"] = list(args.rule)
        try:
            data = post_json(config, "/api/v1/diagnose", payload)
        except RemoteError as exc:
            if exc.status in (400, 422):  # the server refused the selection: a usage error, as locally
                raise UsageError(str(exc)) from exc
            raise
        if args.format == "json":
            print(json.dumps(data, indent=2))
        else:
            from sre_agent.analysis.report import render_dict

            print(render_dict(data, args.format), end="")
        return 0
    from sre_agent.analysis.diagnosis import diagnose
    from sre_agent.errors import SelectionError, UsageError
    from sre_agent.store.sources import open_source

    with open_source(config) as source:
        try:
            report = diagnose(source, selection, rules=args.rule)
        except SelectionError as exc:
            # A selection that selects nothing is a usage problem (exit 2), not a failure of the store.
            raise UsageError(str(exc)) from exc
    print(report.render(args.format), end="")
    return 0
