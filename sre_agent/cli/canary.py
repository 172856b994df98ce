"""``sre-agent canary``: the deploy gate on the command line.

Exit codes (CONTRACTS section 2): 0 pass, 1 fail, 3 inconclusive, 2 usage,
4 could not evaluate (store or server unreachable or unreadable, unknown
version or service).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from sre_agent.cli._common import (
    add_format_option,
    add_selection_options,
    add_store_options,
    config_from_args,
    selection_from_args,
)

__all__ = ["register"]

log = logging.getLogger(__name__)

EPILOG = """SLOs (absolute):
  ttft_p99=2s  itl_p99=80ms  tpot_p50=30ms  e2e_p99=20s  queue_p99=500ms   (any pNN, p99.9, p999)
  error_rate=1%   (failed share at most)      goodput=0.95   (share meeting every latency SLO, at least)
relative: --max-regression ttft_p99=15%   candidate p99 at most 1.15 x baseline p99

Each check tests a share of candidate requests (above the SLO, failed, or above
(1 + margin) x the baseline's quantile) with an any-time-valid boundary and a
variance from time blocks, so polling every minute does not inflate false fails.
A check passes when there is enough data (50 values a side and 5 bad requests
expected at the limit, e.g. 500 for a p99) and no significant regression beyond
its margin (Kayenta's rule); --require-equivalence passes only checks shown to hold.
Too little data gives inconclusive, never pass.

exit codes: 0 pass, 1 fail, 3 inconclusive, 2 usage error,
            4 could not evaluate (store or server unreachable, not a store,
              unknown version or service)        (--dry-run: 0 unless 2 or 4)

examples:
  sre-agent canary --baseline-version v1 --candidate-version v2 \\
      --slo ttft_p99=2s --slo itl_p99=80ms --slo error_rate=1% --slo goodput=0.95 \\
      --max-regression ttft_p99=15%
  sre-agent canary --url http://127.0.0.1:4318 --since-last-deploy --slo e2e_p99=20s --format json
"""


def register(subparsers: Any) -> None:
    """Add the ``canary`` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "canary",
        help="gate a deploy on SLOs: pass, fail or inconclusive",
        description=(
            "Compare the candidate with the baseline (concurrent version pair preferred; before/after windows "
            "supported) and judge SLOs and relative regressions with any-time-valid confidence sequences."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_options(parser, read_store=True)
    add_selection_options(parser)
    gate = parser.add_argument_group("gate")
    gate.add_argument("--slo", metavar="NAME=VALUE", action="append", default=[], help="an SLO (repeatable)")
    gate.add_argument(
        "--max-regression",
        metavar="NAME=PCT",
        action="append",
        default=[],
        help="largest allowed increase over the baseline, e.g. ttft_p99=15%% (repeatable)",
    )
    gate.add_argument("--min-samples", type=int, default=None, metavar="N", help="values per side needed (default 50)")
    gate.add_argument("--alpha", type=float, default=None, help="error level over all checks and polls (default 0.05)")
    gate.add_argument(
        "--findings", type=int, default=None, metavar="N", help="diagnosis findings to attach (default 3)"
    )
    gate.add_argument(
        "--findings-budget",
        type=float,
        default=30.0,
        metavar="S",
        help="longest time the diagnosis may take, seconds (default 30; the HTTP API uses 6)",
    )
    gate.add_argument(
        "--require-equivalence",
        action="store_true",
        help="pass a check only when it is shown to be within its limit (stricter than the default rule)",
    )
    gate.add_argument("--dry-run", action="store_true", help="report pass (exit 0) but record and log the real verdict")
    add_format_option(parser)
    parser.set_defaults(func=run)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"dry_run": bool(args.dry_run)}
    if args.require_equivalence:
        options["require_equivalence"] = True
    for key in ("min_samples", "alpha", "findings"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    return options


#: Exit code when the gate could not evaluate at all.
CANNOT_EVALUATE = 4


def run(args: argparse.Namespace) -> int:
    """Evaluate the gate and print the verdict; exit 4 with one line when it could not evaluate."""
    from sre_agent.errors import CannotEvaluateError, RemoteError, StoreError, UsageError

    if not args.slo and not args.max_regression:
        raise UsageError("give at least one --slo NAME=VALUE or --max-regression NAME=PCT")
    try:
        return _run(args)
    except RemoteError as exc:
        if exc.status == 400:  # the server refused the request's parameters: a usage error
            raise UsageError(str(exc)) from exc
        print(f"error: could not evaluate: {exc}", file=sys.stderr)
        return CANNOT_EVALUATE
    except (StoreError, CannotEvaluateError) as exc:
        print(f"error: could not evaluate: {exc}", file=sys.stderr)
        return CANNOT_EVALUATE


def _run(args: argparse.Namespace) -> int:
    """Evaluate the gate locally (``--db``) or through a server (``--url``) and print the verdict."""
    from sre_agent.canary.verdict import CanarySpec, Verdict, evaluate, render, verdict_from_dict

    selection = selection_from_args(args)
    spec = CanarySpec.from_strings(
        args.slo, args.max_regression, findings_budget_s=args.findings_budget, **_options(args)
    )
    config = config_from_args(args)
    result: Verdict
    if config.url:
        from sre_agent.api.client import post_json

        payload: dict[str, Any] = {
            "selection": selection.to_dict(),
            "slo": list(args.slo),
            "max_regression": list(args.max_regression),
            **_options(args),
        }
        result = verdict_from_dict(post_json(config, "/api/v1/canary", payload))
    else:
        from sre_agent.store.embedded import Store
        from sre_agent.store.sources import open_source

        with open_source(config) as source:
            result = evaluate(source.connection if isinstance(source, Store) else source, selection, spec)
    print(render(result, args.format))
    if result.dry_run:
        print(f"sre-agent canary: dry run, real verdict {result.real_verdict}", file=sys.stderr)
    return result.exit_code
