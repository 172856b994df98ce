"""HTTP forms of the canary gate (CONTRACTS section 4), mounted by ``sre-agent serve``.

Three shapes, because rollout controllers disagree about where a verdict lives:

``GET|POST /api/v1/canary`` (Argo Rollouts ``web`` metric)
    Always 2xx with the verdict JSON when the evaluation ran, whatever the
    verdict: Argo reads ``result.verdict`` in its conditions and counts any
    non-2xx as an *Error* (``consecutiveErrorLimit``), not a failure. Only
    genuine errors are non-2xx: a bad parameter (400), "could not evaluate"
    (422: a version or service the store has never seen; 503: the store is
    unavailable).
``POST /api/v1/canary/webhook`` (Flagger webhook)
    The status code is the verdict: 200 on pass, 412 on fail or inconclusive
    (Flagger advances on 200-202 and halts on anything else), the verdict JSON
    as the body, which Flagger copies into its events; 400, 422 and 503 as
    above, with ``{"error": ...}`` as the body.
``POST /api/v1/canary/evaluations`` then ``GET /api/v1/canary/evaluations/{id}``
    Asynchronous (Datadog-gate style): 202 with an id, the evaluation runs in
    a worker thread, results are kept in memory (bounded count, TTL).

Parameters (query string, JSON body, or Flagger's ``metadata`` map; the
same names everywhere; values are strings unless the JSON body gives lists):

* selection: ``baseline_version`` + ``candidate_version`` | ``deploy_at`` [+
  ``window``] | ``baseline`` + ``candidate`` (``START..END``) |
  ``since_last_deploy=true``; optional ``service``, ``where`` (``KEY=VALUE``,
  comma-separated or repeated); a JSON body may instead carry a
  ``selection`` object (``Selection.to_dict`` form);
* ``slo`` (``NAME=VALUE``, comma-separated or repeated), ``max_regression``
  (``NAME=PCT``), ``min_samples``, ``alpha``, ``dry_run`` (true/false),
  ``require_equivalence`` (true/false), ``findings`` (how many diagnosis
  findings to attach; 0 = none).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sre_agent.analysis.selection import Selection
from sre_agent.api.routes import json_object
from sre_agent.canary.verdict import CanarySpec, Verdict, evaluate
from sre_agent.errors import CannotEvaluateError, ConfigError

if TYPE_CHECKING:
    from sre_agent.api.server import ApiContext

__all__ = ["EvaluationStore", "request_from_params", "routes"]

log = logging.getLogger(__name__)

_SELECTION_KEYS: Final[frozenset[str]] = frozenset(
    {"deploy_at", "window", "baseline_version", "candidate_version", "baseline", "candidate", "service", "where"}
)
_SPEC_KEYS: Final[frozenset[str]] = frozenset(
    {"slo", "max_regression", "min_samples", "alpha", "dry_run", "findings", "require_equivalence"}
)
_TRUE: Final[frozenset[str]] = frozenset({"1", "true", "yes", "on"})
_FALSE: Final[frozenset[str]] = frozenset({"0", "false", "no", "off", ""})


def _strings(value: Any, key: str) -> list[str]:
    """A parameter that may be a string (comma-separated), a list of strings, or a JSON object (``where``)."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [f"{k}={v}" for k, v in value.items()]
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if not isinstance(item, (str, int, float)):
            raise ConfigError(f"parameter {key!r}: expected strings, got {type(item).__name__}")
        out.extend(part.strip() for part in str(item).split(",") if part.strip())
    return out


def _one(value: Any, key: str) -> str:
    values = value if isinstance(value, list) else [value]
    if len(values) != 1:
        raise ConfigError(f"parameter {key!r} given {len(values)} times")
    return str(values[0]).strip()


def _flag(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = _one(value, key).lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"parameter {key!r}: expected true or false, got {text!r}")


def request_from_params(params: Mapping[str, Any]) -> tuple[Selection, CanarySpec]:
    """Selection and spec from flat parameters (see the module docstring).

    Raises:
        ConfigError: an unknown parameter or a malformed value (HTTP 400).
    """
    unknown = set(params) - _SELECTION_KEYS - _SPEC_KEYS - {"selection", "since_last_deploy"}
    if unknown:
        known = ", ".join(sorted(_SELECTION_KEYS | _SPEC_KEYS | {"selection", "since_last_deploy"}))
        raise ConfigError(f"unknown parameter(s) {', '.join(sorted(unknown))}; known: {known}")
    if "selection" in params:
        if not isinstance(params["selection"], Mapping):
            raise ConfigError("'selection' must be an object")
        selection = Selection.from_dict(dict(params["selection"]))
    else:
        data: dict[str, Any] = {}
        for key in _SELECTION_KEYS - {"where"}:
            if key in params:
                data[key] = _one(params[key], key)
        where = _strings(params.get("where"), "where")
        if where:
            pairs = [w.split("=", 1) for w in where]
            if any(len(p) != 2 for p in pairs):
                raise ConfigError("parameter 'where': use KEY=VALUE")
            data["where"] = {k.strip(): v.strip() for k, v in pairs}
        if "since_last_deploy" in params and _flag(params["since_last_deploy"], "since_last_deploy"):
            data["mode"] = "since_last_deploy"
        selection = Selection.from_dict(data)
    options: dict[str, Any] = {}
    try:
        if "min_samples" in params:
            options["min_samples"] = int(_one(params["min_samples"], "min_samples"))
        if "findings" in params:
            options["findings"] = int(_one(params["findings"], "findings"))
        if "alpha" in params:
            options["alpha"] = float(_one(params["alpha"], "alpha"))
    except ValueError as exc:
        raise ConfigError(f"bad number: {exc}") from None
    for flag in ("dry_run", "require_equivalence"):
        if flag in params:
            options[flag] = _flag(params[flag], flag)
    slos, regressions = _strings(params.get("slo"), "slo"), _strings(params.get("max_regression"), "max_regression")
    if not slos and not regressions:
        raise ConfigError("give at least one 'slo' (NAME=VALUE) or 'max_regression' (NAME=PCT) parameter")
    spec = CanarySpec.from_strings(slos, regressions, **options)
    return selection, spec


def _query_params(request: Request) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in request.query_params.multi_items():
        out.setdefault(key, []).append(value)
    return {k: v[0] if len(v) == 1 else v for k, v in out.items()}


def _parse(params: Mapping[str, Any]) -> tuple[Selection, CanarySpec]:
    try:
        return request_from_params(params)
    except ConfigError as exc:
        raise HTTPException(400, str(exc)) from exc


# ------------------------------------------------------------ async store
@dataclass
class _Entry:
    future: Future[Verdict]
    created: float
    params: dict[str, Any] = field(default_factory=dict)


class EvaluationStore:
    """In-memory asynchronous evaluations: at most ``max_entries``, each kept ``ttl_s`` seconds.

    When full, the oldest finished entry is dropped; if every entry is
    still running, :meth:`submit` refuses (HTTP 429) rather than grow.
    ``clock`` is injectable so tests never sleep.
    """

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        *,
        max_entries: int = 256,
        ttl_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._executor = executor
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock

    def _expire(self, now: float) -> None:
        for key in [k for k, e in self._entries.items() if now - e.created > self.ttl_s]:
            del self._entries[key]

    def submit(self, job: Callable[[], Verdict]) -> str | None:
        """Start ``job``; returns its id, or ``None`` when the store is full of running jobs."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            if len(self._entries) >= self.max_entries:
                done = next((k for k, e in self._entries.items() if e.future.done()), None)
                if done is None:
                    return None
                del self._entries[done]
            key = uuid.uuid4().hex
            self._entries[key] = _Entry(self._executor.submit(job), now)
            return key

    def get(self, key: str) -> Future[Verdict] | None:
        """The evaluation's future, or ``None`` when unknown or expired."""
        with self._lock:
            self._expire(self._clock())
            entry = self._entries.get(key)
            return None if entry is None else entry.future

    def __len__(self) -> int:
        return len(self._entries)


# ----------------------------------------------------------------- routes
def routes(ctx: ApiContext, *, evaluations: EvaluationStore | None = None) -> list[BaseRoute]:
    """The canary routes bound to ``ctx`` (``read_cursor``, ``tenant_for``)."""
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sre-agent-canary")
    store = evaluations if evaluations is not None else EvaluationStore(executor)
    # At shutdown, evaluations not started are dropped and running ones finish (like requests in
    # progress) before the store's read connection closes under them.
    ctx.on_close(lambda: executor.shutdown(wait=True, cancel_futures=True))

    def run(tenant: str | None, selection: Selection, spec: CanarySpec) -> Verdict:
        with ctx.read_cursor(tenant) as cursor:
            return evaluate(cursor, selection, spec)

    async def evaluated(tenant: str | None, selection: Selection, spec: CanarySpec) -> Verdict:
        try:
            return await asyncio.wrap_future(executor.submit(run, tenant, selection, spec))
        except CannotEvaluateError as exc:
            # An error for Argo (consecutiveErrorLimit) and Flagger, not a failed analysis.
            raise HTTPException(422, f"cannot evaluate: {exc}") from exc

    async def judged(request: Request, params: Mapping[str, Any]) -> Verdict:
        selection, spec = _parse(params)
        tenant = ctx.tenant_for(request)
        # DuckDB work happens off the event loop; StoreError propagates to the app's 503 handler.
        result = await evaluated(tenant, selection, spec)
        log.info(
            "canary %s: verdict %s score %d", request.url.path, result.real_verdict or result.verdict, result.score
        )
        return result

    async def canary(request: Request) -> JSONResponse:
        params = _query_params(request)
        if request.method == "POST":
            params.update(await json_object(request))
        result = await judged(request, params)
        return JSONResponse(result.to_dict())

    async def webhook(request: Request) -> JSONResponse:
        body = await json_object(request)
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise HTTPException(400, "Flagger 'metadata' must be an object of strings")
        params = {**_query_params(request), **metadata}
        result = await judged(request, params)
        payload = result.to_dict()
        payload["canary"] = {k: body.get(k) for k in ("name", "namespace", "phase", "checksum") if k in body}
        return JSONResponse(payload, status_code=200 if result.verdict == "pass" else 412)

    async def start(request: Request) -> JSONResponse:
        params = {**_query_params(request), **(await json_object(request))}
        selection, spec = _parse(params)
        tenant = ctx.tenant_for(request)
        key = store.submit(lambda: run(tenant, selection, spec))
        if key is None:
            raise HTTPException(429, "too many canary evaluations running; retry later", headers={"Retry-After": "5"})
        href = f"/api/v1/canary/evaluations/{key}"
        return JSONResponse({"id": key, "state": "running", "href": href}, status_code=202, headers={"Location": href})

    async def status(request: Request) -> JSONResponse:
        key = request.path_params["id"]
        future = store.get(key)
        if future is None:
            raise HTTPException(404, f"no canary evaluation {key!r} (unknown or expired)")
        if not future.done():
            return JSONResponse({"id": key, "state": "running", "verdict": "in_progress"})
        error = future.exception()
        if error is not None:
            log.error("canary evaluation %s failed: %s", key, error)
            code = 422 if isinstance(error, CannotEvaluateError) else 503
            return JSONResponse(
                {"id": key, "state": "failed", "verdict": "error", "error": str(error)}, status_code=code
            )
        return JSONResponse({"id": key, "state": "done", **future.result().to_dict()})

    return [
        Route("/api/v1/canary", canary, methods=["GET", "POST"]),
        Route("/api/v1/canary/webhook", webhook, methods=["POST"]),
        Route("/api/v1/canary/evaluations", start, methods=["POST"]),
        Route("/api/v1/canary/evaluations/{id}", status, methods=["GET"]),
    ]
