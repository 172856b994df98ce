"""``POST /api/v1/diagnose``: the diagnosis report over HTTP (CONTRACTS section 3 JSON).

The body is a JSON object: ``{"selection": {...Selection.to_dict() form...},
"rules": [names] (optional)}``; the selection keys may also sit at the top
level (``{"deploy_at": "...", "window": "15m"}``), as the canary endpoints
accept them. Answers 200 with the report, 400 for a malformed request, 422
when the selection selects nothing usable (the message says why), 401/403
from the server's auth, 503 when the store cannot be read.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sre_agent.analysis.selection import Selection
from sre_agent.api.routes import json_object
from sre_agent.errors import ConfigError, SelectionError

if TYPE_CHECKING:
    from sre_agent.analysis.report import Report
    from sre_agent.api.server import ApiContext

__all__ = ["PATH", "request_from_body", "routes"]

log = logging.getLogger(__name__)

PATH: Final[str] = "/api/v1/diagnose"
_SELECTION_KEYS: Final[frozenset[str]] = frozenset(
    {"mode", "deploy_at", "window", "window_s", "baseline_version", "candidate_version", "baseline", "candidate",
     "service", "where"}
)  # fmt: skip


def request_from_body(body: dict[str, Any]) -> tuple[Selection, list[str] | None]:
    """The selection and rule names of a request body; raises ConfigError when malformed."""
    unknown = set(body) - _SELECTION_KEYS - {"selection", "rules", "since_last_deploy"}
    if unknown:
        raise ConfigError(f"unknown keys: {', '.join(sorted(unknown))}")
    raw = body.get("selection")
    if raw is None:
        raw = {k: v for k, v in body.items() if k in _SELECTION_KEYS}
        if body.get("since_last_deploy") in (True, "true", "1"):
            raw.setdefault("mode", "since_last_deploy")
    if not isinstance(raw, dict):
        raise ConfigError("'selection' must be an object")
    rules = body.get("rules")
    if rules is not None and not (isinstance(rules, list) and all(isinstance(r, str) for r in rules)):
        raise ConfigError("'rules' must be a list of rule names")
    return Selection.from_dict(raw), rules


def routes(ctx: ApiContext) -> list[BaseRoute]:
    """The diagnose route bound to ``ctx`` (``read_cursor``, ``tenant_for``)."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sre-agent-diagnose")

    def run(tenant: str | None, selection: Selection, rules: list[str] | None) -> Report:
        from sre_agent.analysis.diagnosis import diagnose

        with ctx.read_cursor(tenant) as cursor:
            return diagnose(cursor, selection, rules=rules)

    async def diagnose_endpoint(request: Request) -> JSONResponse:
        body = await json_object(request)
        try:
            selection, rules = request_from_body(body)
        except ConfigError as exc:
            raise HTTPException(400, str(exc)) from exc
        tenant = ctx.tenant_for(request)
        try:
            # DuckDB work runs off the event loop; StoreError reaches the app's 503 handler.
            report = await asyncio.wrap_future(executor.submit(run, tenant, selection, rules))
        except SelectionError as exc:
            raise HTTPException(422, str(exc)) from exc
        top = report.top
        log.info("diagnose: top finding %s", top.cause if top else "unexplained")
        return JSONResponse(report.to_dict())

    return [Route(PATH, diagnose_endpoint, methods=["POST"])]
