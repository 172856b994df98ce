"""``sre-agent tui``: the incident console over a store file or a running server.

Textual is imported inside :func:`run_tui` only, so listing commands or
running any other command never loads it.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import TYPE_CHECKING

from sre_agent.analysis.explore import DEFAULT_SLOS
from sre_agent.analysis.selection import parse_duration
from sre_agent.cli._common import add_selection_options, add_store_options, config_from_args, selection_from_args
from sre_agent.errors import SreAgentError, UsageError

if TYPE_CHECKING:
    from sre_agent.tui.source import DataSource

__all__ = ["has_terminal", "register", "run_tui"]

EPILOG = """keys: ? help · o/f/s/t overview/findings/slices/traces · enter expand/narrow/open
      c copy Markdown · b/v change comparison · x clear slice · r refresh · q quit

exit codes: 0 quit with q, 1 store or server error (missing, locked or foreign store file,
            server unreachable at start) or no terminal, 2 usage error

examples:
  sre-agent tui --db ./sre-agent.duckdb                  since the last deploy, from a store file
  sre-agent tui --url http://127.0.0.1:4318 --refresh 5  live, against a running `sre-agent serve`
  sre-agent tui --db incident.duckdb --baseline-version v1 --candidate-version v2 --light
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``tui`` command."""
    parser = subparsers.add_parser(
        "tui",
        help="the incident console (Textual)",
        description="What regressed, since which deploy, where, and why; then drill down.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_options(parser, read_store=True)
    add_selection_options(parser)
    parser.add_argument(
        "--slo",
        metavar="NAME=DURATION",
        action="append",
        default=[],
        help=f"p99 target colouring a tile, e.g. ttft=2s (names: {', '.join(DEFAULT_SLOS)})",
    )
    parser.add_argument("--refresh", metavar="SECONDS", type=float, default=10.0, help="live refresh with --url")
    parser.add_argument("--light", action="store_true", help="light theme (textual-light)")
    parser.set_defaults(func=run_tui)


def parse_slos(items: list[str]) -> dict[str, float]:
    """``["ttft=2s", "tpot=80ms"]`` -> ``{"ttft": 2.0, "tpot": 0.08}``."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in DEFAULT_SLOS:
            raise UsageError(f"--slo {item!r}: use NAME=DURATION with NAME one of {', '.join(DEFAULT_SLOS)}")
        out[name] = parse_duration(value) / 1e9
    return out


def has_terminal() -> bool:
    """Whether Textual can run here: it reads keys from stdin and draws on stderr, both must be terminals."""
    streams = (sys.__stdin__, sys.__stderr__)
    return all(stream is not None and stream.isatty() for stream in streams)


def run_tui(args: argparse.Namespace) -> int:
    """Open the console; returns 0 when the user quits.

    The source is checked before the console takes the screen: a store or
    server that cannot answer is one line on stderr and exit 1 (raised as
    :class:`SreAgentError`), and so is a missing terminal.
    """
    config = config_from_args(args)
    selection = selection_from_args(args)
    slos = parse_slos(args.slo)
    if args.refresh <= 0:
        raise UsageError("--refresh must be positive")
    from sre_agent.tui.source import LocalSource, RemoteSource

    source: DataSource = RemoteSource(config) if config.url else LocalSource(config.duckdb_path, config)
    try:
        _check_while_importing(source)
        if not has_terminal():
            raise SreAgentError(
                "the console needs a terminal on stdin and stderr (one of them is redirected); "
                "for a report without one use `sre-agent diagnose`"
            )
        from sre_agent.tui.app import IncidentApp

        app = IncidentApp(source, selection, slos=slos, refresh_s=args.refresh)
        if args.light:
            app.theme = "textual-light"
        app.run()
    finally:
        source.close()
    return 0


def _check_while_importing(source: DataSource) -> None:
    """``source.check()`` in a thread while Textual is imported here, so the two overlap.

    Both are mostly imports under the GIL: the overlap saves little, and the
    check keeps the store it opened for the console's first queries.
    """
    failure: list[BaseException] = []

    def check() -> None:
        try:
            source.check()
        except BaseException as exc:  # re-raised on the calling thread below
            failure.append(exc)

    thread = threading.Thread(target=check, name="sre-agent-check", daemon=True)
    thread.start()
    import sre_agent.tui.app  # noqa: F401  # the import the check overlaps

    thread.join()
    if failure:
        raise failure[0]
