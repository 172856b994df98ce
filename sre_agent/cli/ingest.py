"""``sre-agent ingest``: load telemetry files into the store."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sre_agent.cli._common import add_format_option, add_store_options, config_from_args
from sre_agent.errors import UsageError

__all__ = ["register", "run"]

# Show a progress bar only when there is enough to read for it to matter.
PROGRESS_MIN_BYTES = 8 * 1024 * 1024

EPILOG = """formats (detected from the content; .gz of each is read transparently):
  OTel Collector file-exporter JSON lines   one {"resourceSpans":[...]} or {"resourceMetrics":[...]} per line
  OTel Collector length-prefixed protobuf   4-byte big-endian length + ExportTrace/MetricsServiceRequest
  one OTLP/JSON document                    e.g. opentelemetry-proto's examples/trace.json

Old timestamps are kept (nothing is dropped at ingest). Re-ingesting a file
stores nothing twice. Prompt/completion content and values over 4 KiB are
stored as length + keyed hash unless --keep-content is given.

exit codes: 0 all input stored, 1 some input rejected (the rest is still
stored; see the per-file report), 2 usage error.

examples:
  sre-agent ingest traces.jsonl.gz metrics.jsonl
  sre-agent ingest --url http://127.0.0.1:4318 traces.jsonl   (the server owns the store)
  sre-agent ingest --db incident.duckdb --format json otel-export/*.json
"""


def register(subparsers: Any) -> None:
    """Add the ``ingest`` command."""
    parser = subparsers.add_parser(
        "ingest",
        help="load OTLP telemetry files (collector file exporter, OTLP JSON)",
        description="Load OTLP traces and metrics from files into the DuckDB store.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_options(parser)
    parser.add_argument(
        "--keep-content",
        action="store_true",
        default=None,
        help="store prompt/completion content and long values verbatim (default: length + hash)",
    )
    add_format_option(parser, choices=("text", "json"))
    parser.add_argument("files", nargs="+", metavar="FILE", help="files to load (.gz accepted)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Ingest the files; returns the exit code."""
    from sre_agent.ingest.files import ingest_files
    from sre_agent.ingest.normalise import Normaliser
    from sre_agent.store.embedded import Store

    config = config_from_args(args, keep_content=args.keep_content)
    if config.max_body_bytes < 1:
        raise UsageError("max_body_bytes must be positive")
    if config.url:
        if args.keep_content:
            raise UsageError("--keep-content is the server's setting; it cannot be given with --url")
        results = _send(args.files, config)
        return _finish(results, args, where=config.url, remote=True)
    with Store.open(config.db) as store:
        hash_key = config.hash_key.encode("utf-8") if config.hash_key else store.hash_key
        normaliser = Normaliser(config.keep_content, config.max_attribute_bytes, hash_key=hash_key)
        with _ProgressBar(args.files) as progress:
            results = ingest_files(
                args.files,
                store,
                normaliser,
                progress=progress,
                max_body_bytes=config.max_body_bytes,
                batch_rows=config.batch_max_spans,
            )
    return _finish(results, args, where=config.db)


def _send(files: list[str], config: Any) -> list[Any]:
    """Send the files to a running server (``--url``)."""
    import httpx

    from sre_agent.ingest.remote import send_files

    headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
    with httpx.Client(base_url=config.url, headers=headers, timeout=120.0) as client, _ProgressBar(files) as progress:
        return send_files(files, client, progress, max_body_bytes=config.max_body_bytes)


def _finish(results: list[Any], args: argparse.Namespace, *, where: str, remote: bool = False) -> int:
    """Per-file report on stderr, JSON summary on stdout, and the exit code."""
    for result in results:
        _report(result, remote=remote)
    if args.format == "json":
        totals = {
            key: sum(getattr(r, key) for r in results)
            for key in ("spans", "points", "inserted", "duplicates", "rejected")
        }
        totals["failed_files"] = sum(1 for r in results if r.error is not None)
        json.dump({"target": where, "files": [r.as_dict() for r in results], "totals": totals}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0 if all(r.ok for r in results) else 1


def _report(result: Any, *, remote: bool = False) -> None:
    """One summary line per file on stderr, then its bad lines."""
    if result.error is not None:
        print(f"{result.path}: not ingested: {result.error}", file=sys.stderr)
        return
    parts = []
    if result.spans or not result.points:
        parts.append(f"{result.spans} spans")
    if result.points:
        parts.append(f"{result.points} metric points")
    summary = ", ".join(parts)
    summary += " accepted by the server" if remote else f" ({result.inserted} new, {result.duplicates} duplicates)"
    if result.rejected:
        summary += f", {result.rejected} rejected"
    print(f"{result.path}: {summary} [{result.format}]", file=sys.stderr)
    for number, reason in result.bad_lines:
        print(f"  line {number}: {reason}", file=sys.stderr)
    if result.rejected > len(result.bad_lines) and len(result.bad_lines) >= 20:
        print("  ... (more rejected items not listed)", file=sys.stderr)


class _ProgressBar:
    """A rich progress bar on stderr for large inputs; a no-op otherwise."""

    def __init__(self, files: list[str]) -> None:
        total = 0
        for name in files:
            path = Path(name)
            if path.is_file():
                total += path.stat().st_size
        self.total = total
        self.progress: Any = None
        self.task: Any = None
        self.done: dict[str, int] = {}

    def __enter__(self) -> Any:
        if self.total < PROGRESS_MIN_BYTES:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("ingest"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self.progress.start()
        self.task = self.progress.add_task("ingest", total=self.total)
        return self.update

    def update(self, path: str, done: int, total: int) -> None:
        self.done[path] = done
        self.progress.update(self.task, completed=sum(self.done.values()))

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
