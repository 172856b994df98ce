"""``sre-agent serve --read STORE``: the HTTP API over ClickHouse, with no receivers and no store of its own.

At fleet scale the OTel Collectors receive and ClickHouse stores; what is left for
sre-agent is to answer: ``/api/v1/diagnose``, the canary verdicts Argo Rollouts and
Flagger poll, the console's explore routes and ``/api/v1/status``, all read through
one :class:`~sre_agent.store.clickhouse.ClickHouseConnection`. The same route
modules as ``serve`` are mounted on a :class:`ReadContext`, which offers what they
use of :class:`~sre_agent.api.server.ApiContext` (``config``, ``read_cursor``,
``tenant_for``, ``require_admin``, ``on_close``) and refuses writes (``POST
/api/v1/deploys``: a version's first span is its deploy marker here). Tokens and
tenant tokens work as in ``serve``; a tenant's reads see its rows only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from sre_agent.api.server import (
    API_ROUTE_MODULES,
    OPTIONAL_ROUTE_MODULES,
    UNSET,
    AuthMiddleware,
    ServeAddresses,
    _bind,
    _http_error,
    _route_modules,
    _Server,
    _store_error,
    _Unset,
    effective_tenant,
    run_close_callbacks,
    tenant_of,
)
from sre_agent.config import Config
from sre_agent.errors import StoreError

__all__ = ["ReadContext", "build_read_app", "serve_read"]


class _NoWriter:
    """Stands in for the writer: this server stores nothing."""

    def submit_call(self, fn: Callable[[Any], Any]) -> Any:
        raise HTTPException(
            405, "this server only reads ClickHouse (serve --read): a version's first span is its deploy marker"
        )


@dataclass
class ReadContext:
    """What the route modules get from a read-only server (see the module docstring)."""

    config: Config
    connection: Any
    writer: _NoWriter = field(default_factory=_NoWriter)
    _on_close: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the context closes, before the connection does."""
        self._on_close.append(callback)

    def close(self) -> None:
        """Finish background readers, then close the connection (safe to call twice)."""
        callbacks, self._on_close = self._on_close, []
        run_close_callbacks(callbacks)
        if not self._closed.is_set():
            self._closed.set()
            self.connection.close()

    def tenant_for(self, request: Request) -> str | None:
        """The tenant the request is confined to (401 for a missing or unknown token when auth is on)."""
        return tenant_of(self.config, request)

    def require_admin(self, request: Request) -> None:
        """Raise 403 for tenant-scoped tokens."""
        if self.tenant_for(request) is not None:
            raise HTTPException(403, "this token is scoped to a tenant and cannot write")

    @contextlib.contextmanager
    def read_cursor(self, tenant: str | _Unset | None = UNSET) -> Iterator[Any]:
        """A view of the connection, confined to the request's tenant when its token has one."""
        if self._closed.is_set():
            raise StoreError("the server is shutting down")
        effective = effective_tenant(self.config, tenant)
        yield self.connection.cursor() if effective is None else self.connection.scoped(effective)


def build_read_app(ctx: ReadContext) -> Any:
    """The ASGI app: ``/healthz`` and the API route modules, behind the same auth as ``serve``."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "store": ctx.config.clickhouse})

    routes: list[BaseRoute] = [Route("/healthz", healthz, methods=["GET"])]
    for module in [
        *_route_modules(API_ROUTE_MODULES, optional=False),
        *_route_modules(OPTIONAL_ROUTE_MODULES, optional=True),
    ]:
        routes.extend(module.routes(ctx))
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, StoreError: _store_error})
    return AuthMiddleware(app, ctx.config)


def serve_read(config: Config, *, on_ready: Callable[[ServeAddresses], None] | None = None) -> None:
    """Serve the API over ``config.store`` (ClickHouse) until SIGTERM/SIGINT."""
    from sre_agent.store.sources import open_connection

    http_sock = _bind(config.host, config.http_port)
    try:
        ctx = ReadContext(config, open_connection(config))
        try:
            host = f"[{config.host}]" if ":" in config.host else config.host
            addresses = ServeAddresses(
                http_url=f"http://{host}:{http_sock.getsockname()[1]}", grpc_target=None, db=str(config.clickhouse)
            )
            server = _Server(
                uvicorn.Config(
                    build_read_app(ctx), log_level="warning", lifespan="off", timeout_graceful_shutdown=30,
                    access_log=False,
                ),
                on_ready=lambda: on_ready(addresses) if on_ready is not None else None,
                on_signal=lambda: None,
            )  # fmt: skip
            server.run(sockets=[http_sock])
        finally:
            ctx.close()
    finally:
        http_sock.close()
