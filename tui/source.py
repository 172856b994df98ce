"""Where the console's figures come from: a local store file or a running server.

Both sources answer the same questions with the same dataclasses, so every
screen works identically with ``--db`` and ``--url``. Methods block (DuckDB
queries, HTTP calls): the app calls them from thread workers only. A
:class:`LocalSource` opens the file read-only and gives each call its own
cursor, so concurrent workers never share a DuckDB connection.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import httpx

from sre_agent.analysis import explore, explore_slices
from sre_agent.analysis.explore import Exemplar, Overview, StageBreakdown, Timeline, VersionInfo, WaterfallSpan
from sre_agent.analysis.explore_slices import SliceRow
from sre_agent.analysis.selection import Selection
from sre_agent.api.explore_routes import from_json_dict, selection_to_query
from sre_agent.config import Config
from sre_agent.errors import SreAgentError, StoreError

__all__ = ["DataSource", "DiagnosisUnavailableError", "LocalSource", "RemoteSource"]

log = logging.getLogger(__name__)


class DiagnosisUnavailableError(SreAgentError):
    """The diagnose engine is not installed (or not served); the console shows the rest."""


class DataSource(Protocol):
    """The questions the console asks. Every method may raise :class:`SreAgentError`."""

    description: str
    live: bool

    def overview(self, selection: Selection, slos: Mapping[str, float]) -> Overview: ...
    def timeline(self, selection: Selection, metric: str, buckets: int) -> Timeline: ...
    def stages(self, selection: Selection, metric: str) -> StageBreakdown: ...
    def slices(self, selection: Selection, metric: str) -> list[SliceRow]: ...
    def exemplars(self, selection: Selection, metric: str) -> list[Exemplar]: ...
    def waterfall(self, trace_id: str, around_ns: int | None) -> list[WaterfallSpan]: ...
    def diagnose(self, selection: Selection) -> dict[str, Any]: ...
    def versions(self, service: str | None) -> list[VersionInfo]: ...
    def check(self) -> None: ...
    def warm(self) -> None: ...
    def close(self) -> None: ...


class LocalSource:
    """A DuckDB store file opened read-only (the file does not change while the console runs)."""

    live = False

    def __init__(self, path: str, config: Config | None = None) -> None:
        self.path = path
        # Where OTel Collectors write (config.store = chdb:PATH or clickhouse://...), else the DuckDB file.
        self._clickhouse = config if config is not None and config.clickhouse is not None else None
        self.description = f"store {self._clickhouse.clickhouse}" if self._clickhouse else f"db {path}"
        self._store: Any = None
        self._lock = threading.Lock()
        self._scopes: dict[Selection, explore.Scope] = {}
        self._children: set[Any] = set()

    def check(self) -> None:
        """Open the store and read its tables once; raises :class:`StoreError` when it cannot serve.

        The CLI calls this before the console takes the terminal, so a missing,
        locked or foreign file is one line on stderr and exit 1, not a dialog.
        """
        cur = self._cursor()
        if self._clickhouse is not None:
            cur.close()
            return  # the tables were checked when the connection opened (sources.open_connection)
        try:
            for table in ("spans", "deploys", "metric_points"):
                cur.execute(f"SELECT 1 FROM {table} LIMIT 0")
        except Exception as exc:  # duckdb.CatalogException: a DuckDB file, but not a store
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"{self.path} is not an sre-agent store ({first})") from exc
        finally:
            cur.close()

    def warm(self) -> None:
        """Open the store ahead of the first query (errors surface on that query instead)."""
        try:
            self._cursor().close()
        except Exception:  # reported by the first real query, with its context
            log.debug("warm-up of %s failed", self.path, exc_info=True)

    def _cursor(self) -> Any:
        with self._lock:
            if self._store is None and self._clickhouse is not None:
                from sre_agent.store.sources import open_connection

                self._store = open_connection(self._clickhouse)
            elif self._store is None:
                from sre_agent.store.embedded import Store

                self._store = Store.open(self.path, read_only=True)
            cursor = self._store.cursor()
        # DuckDB draws a progress bar on the terminal for long queries: it would tear the screen.
        cursor.execute("SET enable_progress_bar = false")
        return cursor

    def _run(self, selection: Selection, query: Any) -> Any:
        cur = self._cursor()
        try:
            scope = self._scopes.get(selection)
            if scope is None:
                scope = self._scopes[selection] = explore.resolve_scope(cur, selection)
            return query(cur, scope)
        except SreAgentError:
            raise
        except Exception as exc:  # duckdb errors: a store problem shown in a modal
            raise SreAgentError(f"query failed on {self.path}: {exc}") from exc
        finally:
            cur.close()

    def overview(self, selection: Selection, slos: Mapping[str, float]) -> Overview:
        result: Overview = self._run(selection, lambda cur, scope: explore.overview(cur, scope, slos))
        return result

    def timeline(self, selection: Selection, metric: str, buckets: int) -> Timeline:
        result: Timeline = self._run(selection, lambda cur, scope: explore.timeline(cur, scope, metric, buckets))
        return result

    def stages(self, selection: Selection, metric: str) -> StageBreakdown:
        result: StageBreakdown = self._run(selection, lambda cur, scope: explore.stage_breakdown(cur, scope, metric))
        return result

    def slices(self, selection: Selection, metric: str) -> list[SliceRow]:
        result: list[SliceRow] = self._run(selection, lambda cur, scope: explore_slices.slices(cur, scope, metric))
        return result

    def exemplars(self, selection: Selection, metric: str) -> list[Exemplar]:
        result: list[Exemplar] = self._run(selection, lambda cur, scope: explore.exemplars(cur, scope, metric))
        return result

    def waterfall(self, trace_id: str, around_ns: int | None) -> list[WaterfallSpan]:
        cur = self._cursor()
        try:
            return explore.waterfall(cur, trace_id, around_ns)
        finally:
            cur.close()

    def versions(self, service: str | None) -> list[VersionInfo]:
        cur = self._cursor()
        try:
            return explore.versions(cur, service)
        except Exception as exc:  # duckdb errors: a store problem shown in the dialog
            raise StoreError(f"query failed on {self.path}: {exc}") from exc
        finally:
            cur.close()

    def diagnose(self, selection: Selection) -> dict[str, Any]:
        """Run the diagnose engine in a child process and return the report's JSON form.

        The engine is CPU-heavy Python (estimates, rules); in a thread it would
        hold the GIL and make every key press wait, in a process it cannot.
        """
        if importlib.util.find_spec("sre_agent.analysis.diagnosis") is None:
            raise DiagnosisUnavailableError("the diagnose engine is not installed")
        if self._clickhouse is not None:
            # In this process: the work is ClickHouse's (it leaves the GIL), and one process
            # may hold a chdb directory, so a child could not open it.
            from sre_agent.analysis.diagnosis import diagnose

            return dict(diagnose(self._cursor(), selection).to_dict())
        request = json.dumps({"path": self.path, "selection": selection.to_dict()})
        # Pipes for all three streams: the console owns the terminal, and a child must not draw on it.
        child = subprocess.Popen(
            [sys.executable, "-c", "from sre_agent.tui.source import diagnose_child; diagnose_child()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with self._lock:
            self._children.add(child)
        try:
            out, err = child.communicate(request)
        finally:
            with self._lock:
                self._children.discard(child)
        try:
            status, payload = json.loads(out)
        except ValueError:
            tail = err.strip().splitlines()[-1:] or [f"exit code {child.returncode}"]
            raise SreAgentError(f"the diagnosis process failed: {tail[0]}") from None
        if status == "ok":
            return dict(payload)
        if status == "unavailable":
            raise DiagnosisUnavailableError(str(payload))
        raise SreAgentError(str(payload))

    def close(self) -> None:
        with self._lock:
            for child in self._children:
                child.terminate()  # a diagnosis still running when the user quits
            self._children.clear()
            if self._store is not None:
                self._store.close()
                self._store = None


def diagnose_child() -> None:
    """Child-process body of :meth:`LocalSource.diagnose`.

    Reads ``{"path", "selection"}`` as JSON on stdin and writes one JSON
    ``[status, payload]`` line on stdout: ``["ok", report]``,
    ``["unavailable", reason]`` or ``["error", message]``.
    """
    answer: list[Any]
    try:
        request = json.loads(sys.stdin.read())
        selection = Selection.from_dict(request["selection"])
        try:
            from sre_agent.analysis.diagnosis import diagnose
        except ImportError as exc:
            answer = ["unavailable", f"the diagnose engine cannot load: {exc}"]
        else:
            answer = ["ok", diagnose(request["path"], selection).to_dict()]
    except SreAgentError as exc:
        answer = ["error", str(exc)]
    except Exception as exc:  # the boundary of the child: report, never leave the parent waiting
        answer = ["error", f"{type(exc).__name__}: {exc}"]
    sys.stdout.write(json.dumps(answer) + "\n")


class RemoteSource:
    """A running ``sre-agent serve``, through the explore and diagnose routes.

    ``client`` is injectable (tests pass an ``httpx.Client`` over a real
    loopback server or a MockTransport); it must be safe for concurrent use,
    which ``httpx.Client`` is.
    """

    live = True

    def __init__(self, config: Config, client: httpx.Client | None = None, timeout_s: float = 30.0) -> None:
        self.config = config
        self.description = f"url {config.url}"
        self._client = client or httpx.Client(timeout=timeout_s)
        self._owned = client is None
        self._timeout_s = timeout_s

    def check(self) -> None:
        """Ask the server for its status once; raises :class:`RemoteError` when it does not answer.

        Only the start is strict: once the console runs, an outage shows a banner and retries.
        """
        self._status()

    def warm(self) -> None:
        """Nothing to prepare: the first request connects."""

    def _status(self) -> dict[str, Any]:
        from sre_agent.api.client import get_json

        return get_json(self.config, "/api/v1/status", client=self._client, timeout_s=self._timeout_s)

    def versions(self, service: str | None) -> list[VersionInfo]:
        """The versions of ``GET /api/v1/status``, engine requests only, oldest first."""
        out = [
            VersionInfo(entry.get("service"), str(item["version"]), int(item.get("engine_spans") or 0),
                        str(item.get("first") or ""), str(item.get("last") or ""))
            for entry in self._status().get("services") or []
            if service is None or entry.get("service") == service
            for item in entry.get("versions") or []
            if item.get("version") is not None and item.get("engine_spans")
        ]  # fmt: skip
        return sorted(out, key=lambda v: (v.first, v.service or "", v.version))

    def _get(self, name: str, selection: Selection | None, **extra: Any) -> dict[str, Any]:
        from sre_agent.api.client import get_json

        params: list[tuple[str, str]] = selection_to_query(selection) if selection else []
        for key, value in extra.items():
            values = value if isinstance(value, list) else [value]
            params += [(key, str(v)) for v in values if v is not None]
        return get_json(
            self.config,
            f"/api/v1/explore/{name}",
            params,  # type: ignore[arg-type]  # httpx accepts a list of pairs
            client=self._client,
            timeout_s=self._timeout_s,
        )

    def overview(self, selection: Selection, slos: Mapping[str, float]) -> Overview:
        body = self._get("overview", selection, slo=[f"{k}={v}" for k, v in slos.items()])
        return from_json_dict(Overview, body)

    def timeline(self, selection: Selection, metric: str, buckets: int) -> Timeline:
        return from_json_dict(Timeline, self._get("timeline", selection, metric=metric, buckets=buckets))

    def stages(self, selection: Selection, metric: str) -> StageBreakdown:
        return from_json_dict(StageBreakdown, self._get("stages", selection, metric=metric))

    def slices(self, selection: Selection, metric: str) -> list[SliceRow]:
        body = self._get("slices", selection, metric=metric)
        return [from_json_dict(SliceRow, row) for row in body["slices"]]

    def exemplars(self, selection: Selection, metric: str) -> list[Exemplar]:
        body = self._get("exemplars", selection, metric=metric)
        return [from_json_dict(Exemplar, row) for row in body["exemplars"]]

    def waterfall(self, trace_id: str, around_ns: int | None) -> list[WaterfallSpan]:
        body = self._get("waterfall", None, trace_id=trace_id, around_ns=around_ns)
        return [from_json_dict(WaterfallSpan, row) for row in body["spans"]]

    def diagnose(self, selection: Selection) -> dict[str, Any]:
        from sre_agent.api.client import post_json
        from sre_agent.errors import RemoteError

        try:
            return post_json(
                self.config,
                "/api/v1/diagnose",
                {"selection": selection.to_dict()},
                client=self._client,
                timeout_s=self._timeout_s,
            )
        except RemoteError as exc:
            if "HTTP 404" in str(exc) or "HTTP 405" in str(exc):
                raise DiagnosisUnavailableError("this server does not serve /api/v1/diagnose") from exc
            raise

    def close(self) -> None:
        if self._owned:
            self._client.close()
