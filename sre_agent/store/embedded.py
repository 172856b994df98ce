"""The DuckDB store: canonical spans, metric points and deploy markers.

One process owns a store file for writing (normally ``sre-agent serve``);
other processes either go through its HTTP API (``--url``) or open the file
read-only while no writer holds it. DuckDB enforces this with a file lock;
:meth:`Store.open` turns the lock failure into
:class:`~sre_agent.errors.StoreLockedError` with a message saying what to do.

Writes are Arrow appends, one statement per batch. Ingest is idempotent:
a span re-sent with the same ``(trace_id, span_id)`` (OTLP delivery is
at-least-once) and a metric point with the same ``(series_key, time_ns)``
are never stored twice. Rows are appended sorted by time within each batch
so that DuckDB's per-row-group min/max (zone maps) prune time ranges.

Nothing is deleted at ingest, whatever the timestamps: retention runs only
when :meth:`Store.apply_retention` is called.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sre_agent.errors import StoreError, StoreLockedError
from sre_agent.store.migrate import META_DDL, SCHEMA_VERSION, migrate, needs_upgrade, upgrade_in_place
from sre_agent.store.schema import DEPLOYS_DDL, METRIC_POINTS_DDL, SPANS_DDL
from sre_agent.store.span_rows import to_span_rows

__all__ = ["SCHEMA_VERSION", "Deploy", "Store"]

log = logging.getLogger(__name__)

# First and last start time of every (service, version) seen in spans; the
# source of automatically detected deploys. Small: one row per version.
_VERSIONS_DDL = """CREATE TABLE IF NOT EXISTS service_versions (
    service_name VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    first_ns BIGINT NOT NULL,
    PRIMARY KEY (service_name, version)
)"""


# The tables every store has from its first open; a file without them is not a store.
_STORE_TABLES = ("spans", "metric_points", "deploys")


@dataclass(frozen=True)
class Deploy:
    """A deploy marker.

    Attributes:
        time_ns: when the version started serving, Unix epoch nanoseconds.
        service_name: the ``service.name`` deployed.
        version: the new ``service.version``.
        previous_version: the version it replaced (``None`` when unknown).
        source: ``"mark"`` for explicit marks, ``"auto"`` when detected from spans.
        note: free text given with an explicit mark, else ``None``.
    """

    time_ns: int
    service_name: str
    version: str
    previous_version: str | None
    source: str
    note: str | None = None


# Appends of at least this many rows go through a Parquet staging file
# (Store._insert_staged); smaller ones are not worth a file.
_STAGE_MIN_ROWS = 64
# ... and only when their MAP columns hold at least this many entries a row: DuckDB's Arrow scan
# checks MAP entries one by one, Parquet costs a file. Measured (an ad-hoc script; ingest.py prints
# the append floors by layout) on 4,096-span commits of the ingest
# benchmark's spans with k extra entries a row (CPU us/span, Arrow scan against Parquet): k=1 (what
# an engine span keeps in span_rows) 5.2 against 6.1, k=4 5.9/6.3, k=8 8.1/7.1, k=16 11.5/10.9.
_STAGE_MIN_MAP_ENTRIES_PER_ROW = 6


_STAGE_PREFIX = "sre-agent-stage-"

# DuckDB checkpoints when the write-ahead log reaches this size, inside the commit that crosses
# it. Its default (16 MB, ~37k spans) made checkpoints most of a busy writer's time, and each one
# costs a part that grows with the table: appending 1M spans in 4k-span commits took 30-35 us a
# span with commits' p99 at 1.4 s, against 17-20 us and 129 ms with 256 MB (longest 0.9 s, once;
# tests/benchmarks/store_append.py --checkpoint runs both, interleaved). The price is at restart
# after a crash: the next open replays the log, 140 MiB (1.3M spans) in 0.9 s (--replay). Commits
# are as durable either way.
CHECKPOINT_THRESHOLD = "256MB"


def _stage_parent() -> str | None:
    """Where staging files go: memory-backed /dev/shm when present, else the temp directory (None)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _new_stage_dir() -> str:
    """A private staging folder named after this process; folders of dead processes are removed first.

    A killed writer (SIGKILL, OOM) cannot remove its folder, and a file left
    in /dev/shm holds memory until reboot.
    """
    parent = _stage_parent() or tempfile.gettempdir()
    if os.name == "posix":  # os.kill(pid, 0) only probes on POSIX
        for entry in os.scandir(parent):
            owner = entry.name.removeprefix(_STAGE_PREFIX).split("-", 1)[0]
            if entry.name.startswith(_STAGE_PREFIX) and owner.isdigit() and not _alive(int(owner)):
                shutil.rmtree(entry.path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_STAGE_PREFIX}{os.getpid()}-", dir=parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _map_entries(rows: pa.Table) -> int:
    """How many entries the MAP columns of ``rows`` hold in all."""
    total = 0
    for column in rows.columns:
        if pa.types.is_map(column.type):
            for chunk in column.chunks:
                offsets = chunk.offsets  # a sliced chunk's own (its .keys are the whole child's)
                total += offsets[-1].as_py() - offsets[0].as_py() if len(offsets) else 0
    return total


def _remove(path: str) -> None:
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _locked_message(path: str, exc: Exception) -> str:
    return (
        f"the store {path} is locked by another process ({exc}). If that is `sre-agent serve`, send "
        "telemetry to its OTLP endpoint (e.g. http://127.0.0.1:4318/v1/traces) and query it with "
        "--url http://127.0.0.1:4318; otherwise stop that process. A read-only open also needs the "
        "writer to be gone (DuckDB allows one writing process and no readers beside it)."
    )


def _sorted_by(table: pa.Table, column: str) -> pa.Table:
    """``table`` ordered by ``column`` (ascending), copying rows only when it must.

    A merged receiver batch is a concatenation of requests that are each in
    time order and usually cover disjoint time ranges, so reordering whole
    chunks (zero-copy) nearly always sorts it. A full ``sort_by`` gathers
    every column, the MAP columns included: 0.15-0.4 s for 50,000 spans,
    up to a fifth of an append.
    """
    if table.column(column).null_count:
        return table.sort_by(column)  # NOT NULL columns: the insert reports the error
    batches = [b for b in table.to_batches() if b.num_rows]
    batches.sort(key=lambda b: b.column(column)[0].as_py())
    ordered = pa.Table.from_batches(batches, table.schema)
    if ordered.num_rows < 2 or _is_ascending(ordered.column(column).combine_chunks()):
        return ordered
    return table.sort_by(column)


def _is_ascending(values: pa.Array) -> bool:
    """Whether ``values`` (no nulls) never decrease."""
    return bool(pc.all(pc.greater_equal(values[1:], values[:-1])).as_py())


class Store:
    """A DuckDB store file. Create with :meth:`open`; close with :meth:`close` or ``with``."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: str, *, read_only: bool) -> None:
        self._con = connection
        self.path = path
        self.read_only = read_only
        self._lock = threading.Lock()
        self._closed = False
        self._versions: dict[tuple[str, str], int] = {}
        self._stage_dir: str | None = None  # created on the first staged append
        self._check_is_store()
        if not read_only:
            self._create()
        self._hash_key = self._load_hash_key()
        if self._has_table("service_versions"):
            rows = self._con.execute("SELECT service_name, version, first_ns FROM service_versions").fetchall()
            self._versions = {(s, v): t for s, v, t in rows}

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False) -> Store:
        """Open (creating if needed, unless ``read_only``) the store at ``path``.

        ``":memory:"`` opens a private in-memory store (tests, demos).

        Raises:
            StoreLockedError: another process holds the file.
            StoreError: read-only open of a missing file, or any other failure.
        """
        text = str(path)
        if text != ":memory:":
            file = Path(text)
            if read_only and not file.exists():
                raise StoreError(f"no store at {text}: nothing has been ingested there yet (read-only open)")
            if not read_only and file.parent and not file.parent.exists():
                raise StoreError(f"cannot create the store {text}: directory {file.parent} does not exist")
        try:
            config: dict[str, str | bool | int | float | list[str]] = (
                {} if read_only else {"checkpoint_threshold": CHECKPOINT_THRESHOLD}
            )
            connection = duckdb.connect(text, read_only=read_only, config=config)
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise StoreLockedError(_locked_message(text, exc)) from exc
            raise StoreError(f"cannot open the store {text}: {exc}") from exc
        except duckdb.Error as exc:
            raise StoreError(f"cannot open the store {text}: {exc}") from exc
        if read_only and needs_upgrade(connection):
            connection.close()
            upgrade_in_place(text)
            connection = duckdb.connect(text, read_only=True)
        try:
            return cls(connection, text, read_only=read_only)
        except StoreError:
            connection.close()
            raise
        except duckdb.Error as exc:
            connection.close()
            raise StoreError(f"cannot initialise the store {text}: {exc}") from exc

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._con.close()
                if self._stage_dir is not None:
                    shutil.rmtree(self._stage_dir, ignore_errors=True)

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The store's connection, for read queries on the owning thread."""
        return self._con

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to the same database, for use on another thread."""
        return self._con.cursor()

    @property
    def hash_key(self) -> bytes:
        """The HMAC key for redacted attribute values, random per store."""
        return self._hash_key

    # ------------------------------------------------------------ schema

    def _check_is_store(self) -> None:
        """Refuse a DuckDB file that is not a store, before any query or DDL touches it.

        Without this a read-only open fails later with DuckDB's catalog error on
        the first query, and a writable open adds the store's tables to someone
        else's database. A new or empty file is fine to write: it becomes a store.

        Raises:
            StoreError: the file lacks the store's tables (``spans``, ``metric_points``, ``deploys``).
        """
        tables = {
            row[0]
            for row in self._con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
            ).fetchall()
        }
        missing = [name for name in _STORE_TABLES if name not in tables]
        if not missing or (not self.read_only and not tables):
            return
        held = f"it holds the tables {', '.join(sorted(tables)[:5])}" if tables else "the database is empty"
        raise StoreError(
            f"not an sre-agent store: {self.path} (no {missing[0]} table; {held}). Give --db a file written by "
            "`sre-agent serve`, `ingest`, `replay --db` or `demo --db`, or a new path to create one."
        )

    def _create(self) -> None:
        con = self._con
        migrate(con)
        for ddl in (SPANS_DDL, METRIC_POINTS_DDL, DEPLOYS_DDL, META_DDL, _VERSIONS_DDL):
            con.execute(ddl)
        con.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])
        con.execute("INSERT OR IGNORE INTO meta VALUES ('hash_key', ?)", [secrets.token_hex(32)])

    def _has_table(self, name: str) -> bool:
        row = self._con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
        ).fetchone()
        return bool(row and row[0])

    def _load_hash_key(self) -> bytes:
        if not self._has_table("meta"):
            return b""
        row = self._con.execute("SELECT value FROM meta WHERE key = 'hash_key'").fetchone()
        return bytes.fromhex(row[0]) if row else b""

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"the store {self.path} is open read-only")
        if self._closed:
            raise StoreError(f"the store {self.path} is closed")

    # ------------------------------------------------------------ appends

    def append_spans(self, table: pa.Table) -> int:
        """Append canonical spans; returns how many were new.

        ``table`` has the schema of :func:`sre_agent.store.schema.spans_arrow_schema`,
        or is already in the stored ``span_rows`` form (with ``promoted``; see
        :func:`sre_agent.ingest.otlp.build_spans`). Spans whose ``(trace_id, span_id)`` is already stored, or repeated
        within the batch, are skipped. Also records automatically detected
        deploys (a new ``service.version`` for a ``service.name``).
        """
        if table.num_rows == 0:
            return 0
        batch = _sorted_by(table, "start_ns")
        with self._lock:
            self._writable()
            inserted = self._insert(
                "span_rows",
                batch,
                # A receiver's batch may arrive in the stored form already (build_spans(stored=True)).
                prepare=None if "promoted" in batch.column_names else to_span_rows,
                key=("trace_id", "span_id"),
                time_column="start_ns",
                lo=int(batch["start_ns"][0].as_py()),
                hi=int(batch["start_ns"][-1].as_py()),
            )
            self._detect_versions(batch)
        return inserted

    def append_metric_points(self, table: pa.Table) -> int:
        """Append canonical metric points; returns how many were new.

        Points whose ``(series_key, time_ns)`` is already stored are skipped.
        """
        if table.num_rows == 0:
            return 0
        batch = _sorted_by(table, "time_ns")
        with self._lock:
            self._writable()
            return self._insert(
                "metric_points",
                batch,
                key=("series_key", "time_ns"),
                time_column="time_ns",
                lo=int(batch["time_ns"][0].as_py()),
                hi=int(batch["time_ns"][-1].as_py()),
            )

    def _insert(
        self,
        table_name: str,
        batch: pa.Table,
        *,
        key: tuple[str, str],
        time_column: str,
        lo: int,
        hi: int,
        prepare: Callable[[pa.Table], pa.Table] | None = None,
    ) -> int:
        """Append the rows of ``batch`` (sorted by time) whose key is new; returns how many.

        Two steps: find the new rows from the key columns alone, then append
        just those. The check never converts the batch's MAP columns (the
        costly part of an Arrow insert), so a re-sent batch costs little. A
        re-sent row is identical to the stored one, so its time lies in the
        batch's [lo, hi] range and only that range of the table is scanned,
        which the zone maps make cheap. ``prepare`` turns the new rows into
        the table's stored form.
        """
        con = self._con
        n = batch.num_rows
        ids = batch.select(list(key)).append_column("_position", pa.array(range(n), pa.int64()))
        first, second = key
        try:
            con.register("_sre_ids", ids)
            try:
                # The stored rows that a batch row repeats, by an inner join: DuckDB builds its hash
                # table on the smaller side (the batch) and streams the time range past it. An ANTI
                # JOIN hashed the whole range instead: for 4k spans, 5.6 against 2.6 ms with 8k
                # stored rows in range, 81 against 2.0 ms when a straggler widens it to 2M rows
                # (tests/benchmarks/store_append.py --duplicate-check).
                stored = con.execute(
                    f"""SELECT b._position FROM {table_name} s
                    JOIN _sre_ids b ON s.{first} = b.{first} AND s.{second} = b.{second}
                    WHERE s.{time_column} BETWEEN ? AND ?""",
                    [lo, hi],
                ).fetchnumpy()["_position"]
            finally:
                con.unregister("_sre_ids")
            keep = np.zeros(n, bool)
            # A key repeated within the batch keeps its first row.
            firsts = ids.group_by(list(key), use_threads=False).aggregate([("_position", "min")])["_position_min"]
            keep[np.asarray(firsts)] = True
            keep[stored] = False
            fresh = np.flatnonzero(keep)
            if len(fresh) == 0:
                return 0
            rows = batch if len(fresh) == batch.num_rows else batch.take(pa.array(fresh))
            if prepare is not None:  # only the new rows: a re-sent batch costs the check alone
                rows = prepare(rows)
            staged = rows.num_rows >= _STAGE_MIN_ROWS and _map_entries(rows) >= _STAGE_MIN_MAP_ENTRIES_PER_ROW * len(
                rows
            )
            if not staged or not self._insert_staged(table_name, rows):
                con.register("_sre_rows", rows)
                try:
                    con.execute(f"INSERT INTO {table_name} BY NAME SELECT * FROM _sre_rows")
                finally:
                    con.unregister("_sre_rows")
        except duckdb.Error as exc:
            raise StoreError(f"cannot append to {table_name} in {self.path}: {exc}") from exc
        return len(fresh)

    def _insert_staged(self, table_name: str, rows: pa.Table) -> bool:
        """Append ``rows`` through an uncompressed Parquet file; False when it cannot be written.

        Why: DuckDB's Arrow scan validates every MAP row (unique, non-NULL
        keys) entry by entry; with ~25 attribute entries per span that check
        costs more than writing and reading the same rows as Parquet, whose
        reader builds the MAP vectors directly (tests/benchmarks/store_append.py
        measures both). The file is private to this store and removed right
        after the insert. When it cannot be written (e.g. a small /dev/shm is
        full) the caller appends through the Arrow scan instead.
        """
        import pyarrow.parquet as pq

        path = ""
        try:
            if self._stage_dir is None:
                self._stage_dir = _new_stage_dir()
            path = os.path.join(self._stage_dir, f"{table_name}.parquet")
            pq.write_table(
                rows, path, compression="none", use_dictionary=False, write_statistics=False, row_group_size=1 << 30
            )
        except OSError as exc:
            log.warning("cannot stage %d rows as Parquet (%s); appending through Arrow", rows.num_rows, exc)
            _remove(path)
            return False
        try:
            self._con.execute(f"INSERT INTO {table_name} BY NAME SELECT * FROM read_parquet(?)", [path])
        finally:
            _remove(path)
        return True

    # ------------------------------------------------------------ deploys

    def _detect_versions(self, batch: pa.Table) -> None:
        versions = batch.select(["service_name", "service_version", "start_ns"]).filter(
            pc.and_(pc.is_valid(batch["service_name"]), pc.is_valid(batch["service_version"]))
        )
        if versions.num_rows == 0:
            return
        grouped = versions.group_by(["service_name", "service_version"]).aggregate([("start_ns", "min")])
        changed: set[str] = set()
        for service, version, first in zip(
            grouped["service_name"].to_pylist(),
            grouped["service_version"].to_pylist(),
            grouped["start_ns_min"].to_pylist(),
            strict=True,
        ):
            known = self._versions.get((service, version))
            if known is None or first < known:
                self._versions[(service, version)] = first
                self._con.execute("INSERT OR REPLACE INTO service_versions VALUES (?, ?, ?)", [service, version, first])
                changed.add(service)
        for service in changed:
            self._rebuild_auto_deploys(service)

    def _rebuild_auto_deploys(self, service: str) -> None:
        """Auto deploys of a service follow its versions ordered by first appearance."""
        ordered = sorted((first, version) for (s, version), first in self._versions.items() if s == service)
        self._con.execute("DELETE FROM deploys WHERE service_name = ? AND source = 'auto'", [service])
        rows = [
            (first, service, version, ordered[i - 1][1], "auto", None)
            for i, (first, version) in enumerate(ordered)
            if i > 0
        ]
        if rows:
            self._con.executemany("INSERT OR IGNORE INTO deploys VALUES (?, ?, ?, ?, ?, ?)", rows)

    def mark_deploy(self, service: str, version: str, time_ns: int, note: str | None = None) -> Deploy:
        """Record an explicit deploy marker; the previous version is taken from the spans seen."""
        with self._lock:
            self._writable()
            before = sorted(
                (first, v)
                for (s, v), first in self._versions.items()
                if s == service and v != version and first <= time_ns
            )
            deploy = Deploy(time_ns, service, version, before[-1][1] if before else None, "mark", note)
            self._con.execute(
                "INSERT OR REPLACE INTO deploys VALUES (?, ?, ?, ?, ?, ?)",
                [time_ns, service, version, deploy.previous_version, "mark", note],
            )
        return deploy

    def deploys(self, service: str | None = None) -> list[Deploy]:
        """Deploy markers (explicit and automatic), oldest first; ``service=None`` means all."""
        query = "SELECT time_ns, service_name, version, previous_version, source, note FROM deploys"
        params: list[Any] = []
        if service is not None:
            query += " WHERE service_name = ?"
            params.append(service)
        rows = self.cursor().execute(query + " ORDER BY time_ns, service_name, source", params).fetchall()
        return [Deploy(*row) for row in rows]

    # ------------------------------------------------------------ retention

    def apply_retention(self, max_age_s: float, *, now_ns: int | None = None) -> int:
        """Delete spans and metric points older than ``max_age_s`` seconds; returns rows deleted.

        Args:
            max_age_s: age limit in seconds, measured back from ``now_ns``.
            now_ns: the current time, Unix epoch ns (``None`` = the wall clock).
        """
        cutoff = (time.time_ns() if now_ns is None else now_ns) - int(max_age_s * 1e9)
        deleted = 0
        with self._lock:
            self._writable()
            for table_name, column in (("span_rows", "start_ns"), ("metric_points", "time_ns")):
                row = self._con.execute(f"DELETE FROM {table_name} WHERE {column} < ?", [cutoff]).fetchone()
                deleted += int(row[0]) if row else 0
        return deleted

    def counts(self) -> dict[str, int]:
        """Row counts of the spans, metric_points and deploys tables."""
        con = self.cursor()
        result: dict[str, int] = {}
        for name in ("spans", "metric_points", "deploys"):
            row = con.execute(f"SELECT count(*) FROM {name}").fetchone()
            result[name] = int(row[0]) if row else 0
        return result
