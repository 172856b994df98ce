"""HTTP routes exposing :mod:`sre_agent.explore` for the console's ``--url`` mode.

Every route reads through ``ctx.read_cursor(tenant)``, so a tenant-scoped
token sees only its tenant's spans. The selection travels as query
parameters (:func:`sre_agent.explore.selection_to_query`), answers are the
JSON forms of the explore dataclasses (:func:`sre_agent.explore.to_json_dict`).

Routes (all ``GET``, all JSON):

- ``/api/v1/explore/overview?SELECTION[&slo=NAME=SECONDS...]`` -> Overview
- ``/api/v1/explore/timeline?SELECTION[&metric=e2e][&buckets=60]`` -> Timeline
- ``/api/v1/explore/stages?SELECTION[&metric=e2e]`` -> StageBreakdown
- ``/api/v1/explore/slices?SELECTION[&metric=e2e][&limit=50]`` -> ``{"slices": [SliceRow]}``
- ``/api/v1/explore/exemplars?SELECTION[&metric=e2e][&per_side=5]`` -> ``{"exemplars": [Exemplar]}``
- ``/api/v1/explore/waterfall?trace_id=HEX[&around_ns=NS]`` -> ``{"spans": [WaterfallSpan]}``

Errors: 400 with ``{"error": ...}`` for a bad selection or parameter, 404
when the selection finds nothing to compare.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sre_agent import explore
from sre_agent.errors import ConfigError, SelectionError

if TYPE_CHECKING:
    import duckdb

    from sre_agent.server import ApiContext

__all__ = ["routes"]

_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {raw!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{name} must be between {lo} and {hi}")
    return value


def _slos(request: Request) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in request.query_params.getlist("slo"):
        name, _, value = item.partition("=")
        if name not in explore.DEFAULT_SLOS:
            raise ConfigError(f"slo {name!r}: one of {', '.join(explore.DEFAULT_SLOS)}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ConfigError(f"slo {item!r}: use NAME=SECONDS") from None
    return out


Query = Callable[["duckdb.DuckDBPyConnection", Request], Any]


def _scoped(query: Callable[[duckdb.DuckDBPyConnection, explore.Scope, Request], Any]) -> Query:
    """Resolve the request's selection first, then run ``query`` on the scope."""

    def run(cur: duckdb.DuckDBPyConnection, request: Request) -> Any:
        selection = explore.selection_from_query(request.query_params.multi_items())
        return query(cur, explore.resolve_scope(cur, selection), request)

    return run


def _metric(request: Request) -> str:
    metric = request.query_params.get("metric", "e2e")
    if metric not in explore.LATENCY_METRICS:
        raise ConfigError(f"metric must be one of {', '.join(explore.LATENCY_METRICS)}")
    return metric


def _waterfall(cur: duckdb.DuckDBPyConnection, request: Request) -> Any:
    trace_id = request.query_params.get("trace_id", "")
    if not _TRACE_ID.match(trace_id):
        raise ConfigError("trace_id must be 32 hex digits")
    around = request.query_params.get("around_ns")
    around_ns = int(around) if around and around.isdigit() else None
    return {"trace_id": trace_id.lower(), "spans": explore.waterfall(cur, trace_id.lower(), around_ns)}


QUERIES: dict[str, Query] = {
    "overview": _scoped(lambda cur, scope, req: explore.overview(cur, scope, _slos(req))),
    "timeline": _scoped(
        lambda cur, scope, req: explore.timeline(cur, scope, _metric(req), _int_param(req, "buckets", 60, 2, 1000))
    ),
    "stages": _scoped(lambda cur, scope, req: explore.stage_breakdown(cur, scope, _metric(req))),
    "slices": _scoped(
        lambda cur, scope, req: {
            "slices": explore.slices(cur, scope, _metric(req), limit=_int_param(req, "limit", 50, 1, 1000))
        }
    ),
    "exemplars": _scoped(
        lambda cur, scope, req: {
            "exemplars": explore.exemplars(cur, scope, _metric(req), _int_param(req, "per_side", 5, 1, 100))
        }
    ),
    "waterfall": _waterfall,
}


def routes(ctx: ApiContext) -> list[BaseRoute]:
    """The explore routes bound to ``ctx`` (sync handlers: Starlette runs them in its thread pool)."""

    def endpoint(query: Query) -> Callable[[Request], JSONResponse]:
        def handle(request: Request) -> JSONResponse:
            tenant = ctx.tenant_for(request)
            try:
                with ctx.read_cursor(tenant) as cur:
                    result = query(cur, request)
            except ConfigError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            except SelectionError as exc:
                return JSONResponse({"error": str(exc)}, status_code=404)
            return JSONResponse(explore.to_json_dict(result))

        return handle

    return [Route(f"/api/v1/explore/{name}", endpoint(query), methods=["GET"]) for name, query in QUERIES.items()]
