"""HTTP routes exposing :mod:`sre_agent.analysis.explore` and :mod:`~sre_agent.analysis.explore_slices`.

For the console's ``--url`` mode.

Every route reads through ``ctx.read_cursor(tenant)``, so a tenant-scoped
token sees only its tenant's spans. The selection travels as query
parameters (:func:`selection_to_query`), answers are the JSON forms of the
explore dataclasses (:func:`to_json_dict`); ``RemoteSource`` in the console
decodes them with :func:`selection_from_query` and :func:`from_json_dict`.

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

import dataclasses
import re
import types
import typing
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sre_agent.analysis import explore, explore_slices
from sre_agent.analysis.selection import Selection
from sre_agent.errors import ConfigError, SelectionError

if TYPE_CHECKING:
    import duckdb

    from sre_agent.api.server import ApiContext

__all__ = ["from_json_dict", "routes", "selection_from_query", "selection_to_query", "to_json_dict"]

_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")

# ------------------------------------------------------- wire forms (client and server)


def selection_to_query(selection: Selection) -> list[tuple[str, str]]:
    """Query-string pairs for a selection (``where`` repeats as ``where=KEY=VALUE``)."""
    pairs: list[tuple[str, str]] = []
    for key, value in selection.to_dict().items():
        if key == "where":
            pairs += [("where", f"{k}={v}") for k, v in value.items()]
        else:
            pairs.append((key, str(value)))
    return pairs


def selection_from_query(pairs: Iterable[tuple[str, str]]) -> Selection:
    """Inverse of :func:`selection_to_query`; unrelated keys are left to the caller.

    Raises :class:`~sre_agent.errors.UsageError` on a malformed selection.
    """
    known = {"mode", "deploy_at", "window_s", "window", "baseline_version", "candidate_version"}
    known |= {"baseline", "candidate", "service"}
    data: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key, value in pairs:
        if key == "where":
            name, _, wanted = value.partition("=")
            where[name] = wanted
        elif key in known:
            data[key] = value
    if where:
        data["where"] = where
    return Selection.from_dict(data)


T = TypeVar("T")


def to_json_dict(value: Any) -> Any:
    """A JSON-ready form of any result above (dataclasses become objects, tuples lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_json_dict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_dict(v) for v in value]
    return value


def from_json_dict(cls: type[T], data: Any) -> T:
    """Inverse of :func:`to_json_dict` for the dataclasses of this module."""
    return typing.cast(T, _decode(cls, data))


def _decode(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(inner[0], data) if len(inner) == 1 else data
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_decode(item, v) for v in data]
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in data)
        return tuple(_decode(a, v) for a, v in zip(args, data, strict=True))
    if origin is dict:
        _k, val = typing.get_args(tp)
        return {k: _decode(val, v) for k, v in data.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _decode(hints[f.name], data[f.name]) for f in dataclasses.fields(tp) if f.name in data})
    if tp is float and isinstance(data, int):
        return float(data)
    return data


# ------------------------------------------------------------------ routes


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
        selection = selection_from_query(request.query_params.multi_items())
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
            "slices": explore_slices.slices(cur, scope, _metric(req), limit=_int_param(req, "limit", 50, 1, 1000))
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
            return JSONResponse(to_json_dict(result))

        return handle

    return [Route(f"/api/v1/explore/{name}", endpoint(query), methods=["GET"]) for name, query in QUERIES.items()]
