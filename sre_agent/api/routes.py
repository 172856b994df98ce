"""Core HTTP API routes: store status, deploy markers, spans of a trace.

Every read goes through :meth:`ApiContext.read_cursor`, so a tenant-scoped
token sees only its tenant's rows; writes (deploy markers) run on the single
writer thread and need the admin token.

Routes (all JSON):

- ``GET /api/v1/status``: row counts, time range, services and versions.
- ``GET /api/v1/deploys[?service=NAME]``: deploy markers, newest first.
- ``POST /api/v1/deploys``: mark a deploy, body
  ``{"service": str, "version": str, "time": ISO|unix s (default now),
  "note": str?}`` -> 201; the previous version is taken from the spans seen.
- ``GET /api/v1/spans?trace_id=HEX``: every span of one trace, by start time.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sre_agent.analysis.selection import format_time, parse_time
from sre_agent.errors import SreAgentError
from sre_agent.store.schema import SPAN_COLUMNS

if TYPE_CHECKING:
    from sre_agent.api.server import ApiContext
    from sre_agent.store.embedded import Store

__all__ = ["json_object", "routes"]

_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")
# A trace with more spans than this is cut (the TUI waterfall cannot show more anyway).
MAX_TRACE_SPANS = 10_000
_SPAN_FIELDS = [c.name for c in SPAN_COLUMNS]


def _jsonable(value: Any) -> Any:
    """DuckDB values -> JSON: maps become objects, NaN/inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    return value


def _status(ctx: ApiContext) -> dict[str, Any]:
    with ctx.read_cursor() as cur:
        count_row = cur.execute("SELECT count(*), min(start_ns), max(start_ns) FROM spans").fetchone()
        points_row = cur.execute("SELECT count(*), min(time_ns), max(time_ns) FROM metric_points").fetchone()
        deploys_row = cur.execute("SELECT count(*) FROM deploys").fetchone()
        versions = cur.execute(
            "SELECT service_name, service_version, count(*), count(*) FILTER (WHERE is_engine), "
            "min(start_ns), max(start_ns) FROM spans GROUP BY ALL ORDER BY 1 NULLS LAST, 5"
        ).fetchall()
    spans, first_ns, last_ns = count_row or (0, None, None)
    points, points_first, points_last = points_row or (0, None, None)
    services: dict[str | None, list[dict[str, Any]]] = {}
    for service, version, count, engine, first, last in versions:
        services.setdefault(service, []).append(
            {
                "version": version,
                "spans": count,
                "engine_spans": engine,
                "first": format_time(first),
                "last": format_time(last),
            }
        )
    return {
        "spans": spans,
        "metric_points": points,
        "deploys": deploys_row[0] if deploys_row else 0,
        "first": format_time(first_ns) if first_ns is not None else None,
        "last": format_time(last_ns) if last_ns is not None else None,
        "metric_points_first": format_time(points_first) if points_first is not None else None,
        "metric_points_last": format_time(points_last) if points_last is not None else None,
        "services": [{"service": name, "versions": items} for name, items in services.items()],
    }


def _deploy_row(row: tuple[Any, ...]) -> dict[str, Any]:
    time_ns, service, version, previous, source, note = row
    return {
        "time": format_time(time_ns),
        "time_ns": time_ns,
        "service": service,
        "version": version,
        "previous_version": previous,
        "source": source,
        "note": note,
    }


def _deploys(ctx: ApiContext, service: str | None) -> dict[str, Any]:
    sql = "SELECT time_ns, service_name, version, previous_version, source, note FROM deploys"
    params: list[Any] = []
    if service:
        sql += " WHERE service_name = ?"
        params.append(service)
    with ctx.read_cursor() as cur:
        rows = cur.execute(sql + " ORDER BY time_ns DESC LIMIT 1000", params).fetchall()
    return {"deploys": [_deploy_row(r) for r in rows]}


def _mark_deploy(marker: dict[str, Any]) -> Callable[[Store], dict[str, Any]]:
    """A call for the writer thread that records ``marker`` through the store."""

    def mark(store: Store) -> dict[str, Any]:
        deploy = store.mark_deploy(marker["service"], marker["version"], marker["time_ns"], note=marker["note"])
        return _deploy_row(
            (deploy.time_ns, deploy.service_name, deploy.version, deploy.previous_version, deploy.source, deploy.note)
        )

    return mark


def _parse_marker(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise HTTPException(400, "body must be a JSON object")
    service, version = body.get("service"), body.get("version")
    if not isinstance(service, str) or not service or not isinstance(version, str) or not version:
        raise HTTPException(400, "'service' and 'version' are required strings")
    raw_time = body.get("time")
    try:
        time_ns = time.time_ns() if raw_time is None else parse_time(str(raw_time))
    except SreAgentError as exc:
        raise HTTPException(400, str(exc)) from exc
    note = body.get("note")
    if note is not None and not isinstance(note, str):
        raise HTTPException(400, "'note' must be a string")
    return {"service": service, "version": version, "time_ns": time_ns, "note": note}


def _trace_spans(ctx: ApiContext, trace_id: str) -> dict[str, Any]:
    with ctx.read_cursor() as cur:
        rows = cur.execute(
            f"SELECT {', '.join(_SPAN_FIELDS)} FROM spans WHERE trace_id = ? ORDER BY start_ns, span_id LIMIT ?",
            [trace_id, MAX_TRACE_SPANS + 1],
        ).fetchall()
    spans = [{name: _jsonable(value) for name, value in zip(_SPAN_FIELDS, row, strict=True)} for row in rows]
    return {"trace_id": trace_id, "spans": spans[:MAX_TRACE_SPANS], "truncated": len(spans) > MAX_TRACE_SPANS}


async def json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is ``{}``.

    Raises a 400 ``HTTPException`` when the body is not JSON or not an object,
    so every route answers bad bodies the same way.
    """
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise HTTPException(400, f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise HTTPException(400, "body must be a JSON object")
    return body


def routes(ctx: ApiContext) -> list[BaseRoute]:
    """The core API routes bound to ``ctx``."""

    def status(request: Request) -> JSONResponse:
        return JSONResponse(_status(ctx))

    def list_deploys(request: Request) -> JSONResponse:
        return JSONResponse(_deploys(ctx, request.query_params.get("service")))

    async def mark_deploy(request: Request) -> JSONResponse:
        ctx.require_admin(request)
        marker = _parse_marker(await json_object(request))
        deploy = await asyncio.wrap_future(ctx.writer.submit_call(_mark_deploy(marker)))
        return JSONResponse({"deploy": deploy}, status_code=201)

    def trace_spans(request: Request) -> JSONResponse:
        trace_id = request.query_params.get("trace_id", "")
        if not _TRACE_ID.match(trace_id):
            raise HTTPException(400, "trace_id must be 32 hex digits")
        return JSONResponse(_trace_spans(ctx, trace_id.lower()))

    return [
        Route("/api/v1/status", status, methods=["GET"]),
        Route("/api/v1/deploys", list_deploys, methods=["GET"]),
        Route("/api/v1/deploys", mark_deploy, methods=["POST"]),
        Route("/api/v1/spans", trace_spans, methods=["GET"]),
    ]
