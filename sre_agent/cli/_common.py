"""Options shared by several commands, bundled once."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from sre_agent.analysis.selection import Selection, parse_duration, parse_time, parse_window
from sre_agent.config import STORE_PREFIXES, Config, load_config
from sre_agent.errors import UsageError

__all__ = [
    "add_format_option",
    "add_selection_options",
    "add_store_options",
    "config_from_args",
    "selection_from_args",
]


def add_store_options(parser: argparse.ArgumentParser, *, allow_url: bool = True, read_store: bool = False) -> None:
    """``--db PATH`` (and ``--url URL``, ``--token TOKEN`` where remote access makes sense).

    ``read_store`` adds ``--store`` for commands that only read (diagnose, canary).
    """
    group = parser.add_argument_group("store")
    group.add_argument("--db", metavar="PATH", help="DuckDB store file (default ./sre-agent.duckdb, env SRE_AGENT_DB)")
    if read_store:
        group.add_argument(
            "--store",
            metavar="STORE",
            help="read duckdb:PATH, chdb:PATH or clickhouse://user@host:8123/db (the OTel Collector "
            "ClickHouse exporter's tables; env SRE_AGENT_STORE)",
        )
    if allow_url:
        group.add_argument(
            "--url", metavar="URL", help="a running `sre-agent serve`, e.g. http://127.0.0.1:4318 (env SRE_AGENT_URL)"
        )
    group.add_argument("--token", metavar="TOKEN", help="bearer token for the API (env SRE_AGENT_TOKEN)")


def add_format_option(parser: argparse.ArgumentParser, choices: tuple[str, ...] = ("text", "json", "markdown")) -> None:
    """``--format`` with ``text`` as the default."""
    parser.add_argument("--format", choices=choices, default="text", help="output format (default: text)")


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """The SELECTION of CONTRACTS section 2, plus ``--service`` and ``--where``."""
    group = parser.add_argument_group("selection (one of)")
    group.add_argument("--deploy-at", metavar="TIME", help="baseline before TIME, candidate after (ISO 8601 or Unix s)")
    group.add_argument("--window", metavar="DURATION", help="per side, with --deploy-at or --since-last-deploy")
    group.add_argument("--baseline-version", metavar="V", help="service.version of the baseline")
    group.add_argument("--candidate-version", metavar="W", help="service.version of the candidate")
    group.add_argument("--baseline", metavar="START..END", help="explicit baseline window")
    group.add_argument("--candidate", metavar="START..END", help="explicit candidate window")
    group.add_argument("--since-last-deploy", action="store_true", help="the latest deploy marker or version change")
    filters = parser.add_argument_group("filters")
    filters.add_argument("--service", metavar="NAME", help="only spans of this service.name")
    filters.add_argument(
        "--where", metavar="KEY=VALUE", action="append", default=[], help="attribute filter (repeatable)"
    )


def selection_from_args(args: argparse.Namespace) -> Selection:
    """Build a Selection from parsed selection options; exactly one mode must be given."""
    modes = [
        name
        for name, given in (
            ("deploy_at", args.deploy_at is not None),
            ("versions", args.baseline_version is not None or args.candidate_version is not None),
            ("windows", args.baseline is not None or args.candidate is not None),
            ("since_last_deploy", bool(args.since_last_deploy)),
        )
        if given
    ]
    if len(modes) > 1:
        raise UsageError(f"choose one selection, not {' and '.join(modes)}")
    mode = modes[0] if modes else "since_last_deploy"
    where: list[tuple[str, str]] = []
    for item in args.where:
        if "=" not in item:
            raise UsageError(f"--where {item!r}: use KEY=VALUE")
        key, value = item.split("=", 1)
        where.append((key.strip(), value.strip()))
    return Selection(
        mode=mode,  # type: ignore[arg-type]
        deploy_at_ns=parse_time(args.deploy_at) if args.deploy_at is not None else None,
        window_ns=parse_duration(args.window) if args.window is not None else None,
        baseline_version=args.baseline_version,
        candidate_version=args.candidate_version,
        baseline=parse_window(args.baseline) if args.baseline is not None else None,
        candidate=parse_window(args.candidate) if args.candidate is not None else None,
        service=args.service,
        where=tuple(where),
    )


def config_from_args(args: argparse.Namespace, **extra: Any) -> Config:
    """Config with the store flags (and any ``extra`` flags) applied on top.

    ``--db`` and ``--url`` name two different stores, so giving both is a usage
    error. A ``--db`` flag also outranks a URL from the environment or the
    config file (flags > environment > file), which would otherwise win silently.
    """
    db, url, store = getattr(args, "db", None), getattr(args, "url", None), getattr(args, "store", None)
    given = [name for name, value in (("--db", db), ("--store", store), ("--url", url)) if value is not None]
    if len(given) > 1:
        raise UsageError(f"give one of --db PATH, --store STORE or --url URL, not both {given[0]} and {given[1]}")
    if store is not None and not store.startswith(STORE_PREFIXES):
        raise UsageError(f"--store {store!r}: use duckdb:PATH, chdb:PATH or clickhouse://user@host:8123/db")
    flags: dict[str, Any] = {"db": db, "url": url, "store": store, "token": getattr(args, "token", None)}
    flags.update(extra)
    config = load_config(flags)
    if (db is not None or store is not None) and config.url is not None:
        config = dataclasses.replace(config, url=None)
    if db is not None and config.store is not None:
        config = dataclasses.replace(config, store=None)
    return config
