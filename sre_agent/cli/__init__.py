"""The ``sre-agent`` console script: a thin skin over the library.

Each command lives in its own module ``sre_agent.cli.<command>`` exposing
``register(subparsers) -> None``; that function adds an argparse parser whose
``func`` default takes the parsed namespace and returns an exit code. Errors
derived from :class:`~sre_agent.errors.SreAgentError` are printed once on
stderr (exit 2 for usage errors, 1 otherwise); anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from sre_agent.errors import SreAgentError, UsageError

__all__ = ["main"]

# Order is the order shown in --help. A module that is missing or fails to
# import is reported on stderr and skipped so that the other commands work.
COMMANDS: tuple[str, ...] = (
    "demo",
    "serve",
    "ingest",
    "diagnose",
    "canary",
    "replay",
    "tui",
    "rules",
    "policy",
)

EPILOG = """examples:
  sre-agent demo                                  replay a built-in incident and diagnose it
  sre-agent serve --db ./sre-agent.duckdb         receive OTLP on 4318 (HTTP) and 4317 (gRPC)
  sre-agent ingest traces.jsonl.gz                load collector file-exporter output
  sre-agent diagnose --since-last-deploy          what regressed since the last deploy, and why
  sre-agent canary --baseline-version v1 --candidate-version v2 --slo ttft_p99=2s
"""


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of exiting, so exit codes stay ours."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available command registered."""
    parser = _Parser(
        prog="sre-agent",
        description="Incident diagnosis and canary gating for vLLM/SGLang serving stacks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from sre_agent import __version__

    parser.add_argument("--version", action="version", version=f"sre-agent {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"sre_agent.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"sre_agent.cli.{name}":
                continue  # command not built yet
            print(f"sre-agent: command {name!r} unavailable: {exc}", file=sys.stderr)
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (see CONTRACTS section 2)."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        code: int = args.func(args)
        return code
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SreAgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
