"""``sre-agent serve``: OTLP receivers (HTTP 4318, gRPC 4317) and the HTTP API."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sre_agent.cli._common import add_store_options, config_from_args
from sre_agent.config import scrape_targets
from sre_agent.errors import ConfigError, StoreLockedError, UsageError

__all__ = ["register"]

EPILOG = """examples:
  sre-agent serve --db ./sre-agent.duckdb
      receive OTLP on 127.0.0.1:4318 (HTTP) and 127.0.0.1:4317 (gRPC); Ctrl-C flushes and exits 0

  sre-agent serve --host 0.0.0.0 --token s3cret --grpc-port 0
      listen on every interface, require `Authorization: Bearer s3cret`, no gRPC

  # then point vLLM at it (gRPC is vLLM's default protocol):
  OTEL_EXPORTER_OTLP_TRACES_INSECURE=true vllm serve MODEL --otlp-traces-endpoint grpc://127.0.0.1:4317

  sre-agent serve --scrape http://127.0.0.1:8000/metrics --scrape-interval 5
      also pull vLLM's (or SGLang's) Prometheus /metrics every 5 s into the store, no Collector needed

  sre-agent serve --read clickhouse://reader@clickhouse:8123/otel --host 0.0.0.0
      only the API (diagnose, canary for Argo Rollouts / Flagger, console), read from the OTel
      Collector ClickHouse exporter's tables; no receivers, nothing stored
"""


def register(subparsers: Any) -> None:
    """Add the ``serve`` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="receive OTLP telemetry and serve the HTTP API (owns the store)",
        description=(
            "Receive OTLP traces and metrics over HTTP (/v1/traces, /v1/metrics; protobuf or JSON, gzip) "
            "and gRPC, store them in DuckDB, and serve the HTTP API (/api/v1/..., /healthz, /metrics). "
            "Requests are acknowledged only after their data is committed; when the queue is full "
            "clients get 429 / UNAVAILABLE with Retry-After. SIGTERM or SIGINT flushes and exits 0."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_options(parser, allow_url=False)
    parser.add_argument(
        "--read",
        metavar="STORE",
        help="serve only the API, reading chdb:PATH or clickhouse://user@host:8123/db (no receivers)",
    )
    net = parser.add_argument_group("network")
    net.add_argument("--host", metavar="ADDR", help="address to bind (default 127.0.0.1, env SRE_AGENT_HOST)")
    net.add_argument("--http-port", type=int, metavar="PORT", help="OTLP/HTTP and API port (default 4318; 0 = any)")
    net.add_argument("--grpc-port", type=int, metavar="PORT", help="OTLP/gRPC port (default 4317; 0 disables gRPC)")
    parser.add_argument(
        "--keep-content",
        action="store_true",
        default=None,
        help="store prompt/completion attributes verbatim instead of length + keyed hash",
    )
    parser.add_argument(
        "--decode-workers",
        type=int,
        default=0,
        metavar="N",
        help="decode OTLP bodies in N worker processes (default 0: in the server process)",
    )
    scrape = parser.add_argument_group("engine metrics")
    scrape.add_argument(
        "--scrape",
        action="append",
        metavar="URL",
        help="pull Prometheus text from URL (vLLM /metrics, SGLang --enable-metrics); repeatable; "
        "labels and more targets: [[scrape]] in the config file (env SRE_AGENT_SCRAPE, comma-separated)",
    )
    scrape.add_argument(
        "--scrape-interval",
        type=_seconds,
        metavar="SECONDS",
        help="seconds between scrapes of a target (default 5, env SRE_AGENT_SCRAPE_INTERVAL_S)",
    )
    parser.set_defaults(func=run)


def _run_read(args: argparse.Namespace, config: Any) -> int:
    """``serve --read STORE``: the API over ClickHouse, until SIGTERM/SIGINT."""
    import dataclasses

    from sre_agent.config import STORE_PREFIXES

    if not args.read.startswith(STORE_PREFIXES[1:]):
        raise UsageError(f"--read {args.read!r}: use chdb:PATH or clickhouse://user@host:8123/db")
    if args.db is not None or args.scrape or args.decode_workers:
        raise UsageError("--read serves only the API: --db, --scrape and --decode-workers do not apply")
    from sre_agent.api.read_server import serve_read
    from sre_agent.api.server import ServeAddresses

    def announce(addresses: ServeAddresses) -> None:
        print(f"sre-agent serve: reading {addresses.db} (API only, no receivers)", file=sys.stderr)
        print(f"sre-agent serve: API on {addresses.http_url}", file=sys.stderr)
        print("sre-agent serve: ready (Ctrl-C or SIGTERM to stop)", file=sys.stderr, flush=True)

    serve_read(dataclasses.replace(config, store=args.read), on_ready=announce)
    print("sre-agent serve: stopped", file=sys.stderr)
    return 0


def _seconds(text: str) -> float:
    """A positive number of seconds ("5", "0.5", "5s")."""
    try:
        value = float(text.removesuffix("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; exit 0 on a clean shutdown, 1 on a startup error."""
    from sre_agent.api.server import ServeAddresses, serve

    try:
        targets = scrape_targets(args.scrape, "--scrape") if args.scrape else None
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    config = config_from_args(
        args,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        keep_content=args.keep_content,
        scrape=targets,
        scrape_interval_s=args.scrape_interval,
    )

    if args.read is not None:
        return _run_read(args, config)

    def announce(addresses: ServeAddresses) -> None:
        print(f"sre-agent serve: store {addresses.db}", file=sys.stderr)
        print(f"sre-agent serve: OTLP/HTTP and API on {addresses.http_url}", file=sys.stderr)
        if addresses.grpc_target is not None:
            print(f"sre-agent serve: OTLP/gRPC on {addresses.grpc_target}", file=sys.stderr)
        for target in config.scrape:
            print(
                f"sre-agent serve: scraping {target.url} every {config.scrape_interval_s:g} s "
                f"(service.instance.id={target.instance_id})",
                file=sys.stderr,
            )
        print("sre-agent serve: ready (Ctrl-C or SIGTERM to stop)", file=sys.stderr, flush=True)

    try:
        serve(config, on_ready=announce, decode_workers=args.decode_workers)
    except StoreLockedError as exc:
        # The CLI prints SreAgentErrors without a traceback; make sure the file is named.
        if config.db in str(exc):
            raise
        raise StoreLockedError(f"{config.db} is locked by another process ({exc})") from exc
    print("sre-agent serve: stopped; queued data committed", file=sys.stderr)
    return 0
