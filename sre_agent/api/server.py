"""``sre-agent serve``: the OTLP/HTTP receiver and the HTTP API in one ASGI app.

One process owns the DuckDB file for writing. Requests are decoded on the
event loop (large bodies in a worker thread), queued on the single
:class:`~sre_agent.ingest.receiver.Writer`, and answered only after the writer has
committed them. API routes read through :meth:`ApiContext.read_cursor`,
which hands out a separate DuckDB cursor on the same in-process database and,
for a tenant-scoped token, shadows ``spans`` and ``metric_points`` with views
filtered to that tenant, so that route code cannot forget the scoping.

Route modules are plug-ins: each module named in :data:`API_ROUTE_MODULES`
or :data:`OPTIONAL_ROUTE_MODULES` exposes ``routes(ctx) -> list[BaseRoute]``;
optional modules that are not installed are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sre_agent.api.auth import CURRENT_PRINCIPAL, authenticate, bearer_token
from sre_agent.config import Config
from sre_agent.errors import BadPayloadError, OverloadedError, PayloadTooLargeError, StoreError
from sre_agent.ingest.otlp_transport import (
    JSON,
    GzipInflater,
    decode_payload,
    export_response_bytes,
    media_type_of,
    status_bytes,
    table_for_signal,
)
from sre_agent.ingest.receiver import ReceiverStats, Writer
from sre_agent.store.sql_text import ident, literal

if TYPE_CHECKING:
    import duckdb

    from sre_agent.ingest.decode_pool import DecodePool
    from sre_agent.ingest.normalise import Normaliser
    from sre_agent.ingest.scrape import Scraper
    from sre_agent.store.embedded import Store

__all__ = [
    "API_ROUTE_MODULES",
    "OPTIONAL_ROUTE_MODULES",
    "ApiContext",
    "build_app",
]

log = logging.getLogger(__name__)

API_ROUTE_MODULES: Final[tuple[str, ...]] = ("sre_agent.api.routes", "sre_agent.api.canary_routes")
# Feature modules added by other parts of the project; skipped when absent.
OPTIONAL_ROUTE_MODULES: Final[tuple[str, ...]] = (
    "sre_agent.api.diagnose_routes",
    "sre_agent.api.explore_routes",
)

# Bodies above this size are decoded in a worker thread so /healthz stays responsive.
_INLINE_DECODE_BYTES: Final = 1 << 20

# google.rpc.Code values used in error bodies.
_RPC_INVALID_ARGUMENT: Final = 3
_RPC_UNAUTHENTICATED: Final = 16
_RPC_PERMISSION_DENIED: Final = 7
_RPC_RESOURCE_EXHAUSTED: Final = 8
_RPC_UNAVAILABLE: Final = 14
_RPC_NOT_FOUND: Final = 5


# -- authentication and tenant scoping ----------------------------------------


class _Unset:
    """Marker for "argument not given" (``None`` means "unscoped")."""


UNSET: Final = _Unset()


@dataclass
class ApiContext:
    """What route modules get: config, reads, the writer, and per-request auth.

    Attributes:
        config: the effective configuration.
        store: the store opened for writing (use :meth:`read_cursor` to read).
        writer: the single writer; ``writer.submit_call(fn)`` runs ``fn(store)``
            on the writer thread (e.g. to insert a deploy marker).
        stats: receiver counters (``/metrics``).
        normaliser: the ingest normaliser shared by the receivers.
        decode_pool: worker processes decoding OTLP bodies (None = decode in-process).
        scraper: pulls engine ``/metrics`` targets (``--scrape``); None when there are none.
    """

    config: Config
    store: Store
    writer: Writer
    stats: ReceiverStats
    normaliser: Normaliser
    decode_pool: DecodePool | None = None
    scraper: Scraper | None = None
    # Read cursors are derived from one connection that nothing else uses, under a
    # lock: DuckDB connection objects are not thread-safe, and the store's own
    # connection belongs to the writer thread.
    _reader_root: duckdb.DuckDBPyConnection | None = field(default=None, repr=False)
    _reader_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _on_close: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self._reader_root is None:
            self._reader_root = self.store.cursor()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the context closes, before the read connection does.

        Route modules that read off the request path (background jobs) register the wait
        for their work here: DuckDB refuses to close a connection a cursor is still using.
        """
        self._on_close.append(callback)

    def close(self) -> None:
        """Finish background readers, then close the connection read cursors derive from (safe to call twice)."""
        callbacks, self._on_close = self._on_close, []
        run_close_callbacks(callbacks)
        with self._reader_lock:
            if self._reader_root is not None:
                self._reader_root.close()
                self._reader_root = None

    def _new_cursor(self) -> duckdb.DuckDBPyConnection:
        with self._reader_lock:
            if self._reader_root is None:
                raise StoreError("the server is shutting down")
            return self._reader_root.cursor()

    def tenant_for(self, request: Request) -> str | None:
        """The tenant the request is confined to, or None for an admin token / open server.

        Raises:
            HTTPException: 401 when auth is on and the token is missing or unknown.
        """
        return tenant_of(self.config, request)

    def require_admin(self, request: Request) -> None:
        """Raise 403 for tenant-scoped tokens (writes such as deploy markers need the admin token)."""
        if self.tenant_for(request) is not None:
            raise HTTPException(403, "this token is scoped to a tenant and cannot write")

    @contextlib.contextmanager
    def read_cursor(self, tenant: str | _Unset | None = UNSET) -> Iterator[duckdb.DuckDBPyConnection]:
        """A fresh read cursor on the store, closed on exit.

        Inside a request the tenant comes from the request's token: a
        tenant-scoped token always gets a cursor where ``spans`` and
        ``metric_points`` are temporary views filtered to its tenant
        (``tenant`` may only repeat that tenant). Outside a request (e.g. a
        background job) pass ``tenant`` explicitly, ``None`` meaning
        unscoped; when tenant tokens are configured an implicit call there
        is refused rather than silently unscoped.
        """
        effective = effective_tenant(self.config, tenant)
        cursor = self._new_cursor()
        try:
            if effective is not None:
                _shadow_tables(cursor, effective)
            yield cursor
        finally:
            cursor.close()


def run_close_callbacks(callbacks: list[Callable[[], None]]) -> None:
    """Run each callback; one that fails is logged and must not keep the store open."""
    for callback in callbacks:
        try:
            callback()
        except Exception:  # boundary: the others still run, and the store still closes
            log.exception("a close callback failed")


def tenant_of(config: Config, request: Request) -> str | None:
    """The tenant ``request``'s token is confined to, or None for an admin token / open server.

    Raises:
        HTTPException: 401 when auth is on and the token is missing or unknown.
    """
    principal = request.scope.get("sre_agent.principal") or authenticate(config, bearer_token(request.headers))
    if principal is None:
        raise HTTPException(401, "missing or invalid bearer token", headers={"WWW-Authenticate": "Bearer"})
    return principal.tenant


def effective_tenant(config: Config, tenant: str | _Unset | None = UNSET) -> str | None:
    """The tenant a read must be confined to (see :meth:`ApiContext.read_cursor`)."""
    principal = CURRENT_PRINCIPAL.get()
    if principal is not None and principal.tenant is not None:
        if not isinstance(tenant, _Unset) and tenant != principal.tenant:
            raise HTTPException(403, "this token cannot read another tenant's data")
        return principal.tenant
    if isinstance(tenant, _Unset):
        if principal is None and config.tenant_tokens:
            raise StoreError("read_cursor() outside a request must name the tenant (None = unscoped)")
        return None
    return tenant


def _shadow_tables(cursor: duckdb.DuckDBPyConnection, tenant: str) -> None:
    """Replace ``spans``/``span_rows``/``metric_points`` by tenant-filtered temp views on this cursor only.

    DuckDB resolves unqualified (and ``main.``-qualified) names to the temp
    catalog first, so every query on this cursor sees only the tenant's rows.
    """
    row = cursor.execute("SELECT current_database()").fetchone()
    database = str(row[0]) if row else "main"
    qualified = ident(database) + ".main"
    tenant_sql = literal(tenant)
    cursor.execute(
        f"CREATE OR REPLACE TEMP VIEW spans AS SELECT * FROM {qualified}.spans WHERE tenant_id = {tenant_sql}"
    )
    # The diagnosis's scans read the stored table (resolve.SCAN): shadowed the same way.
    cursor.execute(
        f"CREATE OR REPLACE TEMP VIEW span_rows AS SELECT * FROM {qualified}.span_rows WHERE tenant_id = {tenant_sql}"
    )
    cursor.execute(
        "CREATE OR REPLACE TEMP VIEW metric_points AS SELECT * FROM "
        f"{qualified}.metric_points WHERE coalesce(attributes['tenant.id'], "
        f"resource_attributes['tenant.id']) = {tenant_sql}"
    )


class AuthMiddleware:
    """Checks the bearer token of every request except ``/healthz`` (pure ASGI, cheap).

    OTLP paths (``/v1/...``) and writes need the admin token; ``/api/``
    reads accept tenant tokens too. The principal is published to the
    request scope and to a context variable read by :meth:`ApiContext.read_cursor`.
    """

    def __init__(self, app: ASGIApp, config: Config) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        principal = authenticate(self.config, bearer_token(headers))
        is_otlp = scope["path"].startswith("/v1/")
        if principal is None or (principal.tenant is not None and (is_otlp or scope["path"] == "/metrics")):
            code, rpc, message = (
                (401, _RPC_UNAUTHENTICATED, "missing or invalid bearer token")
                if principal is None
                else (403, _RPC_PERMISSION_DENIED, "a tenant-scoped token cannot send telemetry")
            )
            if is_otlp:
                response = status_response(code, rpc, message, media_type_of(headers.get("content-type")) or JSON)
            else:
                response = JSONResponse({"error": message}, status_code=code)
            if code == 401:
                response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        scope["sre_agent.principal"] = principal
        token = CURRENT_PRINCIPAL.set(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            CURRENT_PRINCIPAL.reset(token)


# -- OTLP/HTTP ------------------------------------------------------------------


def status_response(
    http_status: int, rpc_code: int, message: str, media_type: str, headers: dict[str, str] | None = None
) -> Response:
    """An error answer whose body is a ``google.rpc.Status`` in ``media_type``."""
    body = status_bytes(rpc_code, message, media_type, bad_request=http_status == 400)
    return Response(body, http_status, headers=headers, media_type=media_type)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, gunzipped if ``Content-Encoding: gzip``, at most ``max_bytes`` after decompression.

    Decompression is incremental with an output limit, so a gzip bomb costs
    at most ``max_bytes`` of memory before it is refused.

    Raises:
        PayloadTooLargeError: the (decompressed) body exceeds ``max_bytes``.
        BadPayloadError: unsupported Content-Encoding or corrupt gzip data.
    """
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip", "x-gzip"):
        raise BadPayloadError(f"unsupported Content-Encoding {encoding!r} (use gzip or none)")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(f"body of {declared} bytes exceeds the {max_bytes}-byte limit")
    too_large = PayloadTooLargeError(f"body exceeds the {max_bytes}-byte limit after decompression")
    if encoding in ("identity", ""):
        parts: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_large
            parts.append(chunk)
        return b"".join(parts)
    gunzip = GzipInflater(max_bytes, too_large)
    compressed = 0
    async for chunk in request.stream():
        compressed += len(chunk)
        if compressed > max_bytes:
            raise too_large
        gunzip.feed(chunk)
    return gunzip.finish()


def _otlp_endpoint(ctx: ApiContext, signal: str) -> Callable[[Request], Awaitable[Response]]:
    table_kind = table_for_signal(signal)
    stats_prefix = table_kind

    async def export(request: Request) -> Response:
        status = "500"
        try:
            response = await _export(request)
            status = str(response.status_code)
            return response
        finally:
            ctx.stats.count_request("http", signal, status)

    async def _export(request: Request) -> Response:
        media_type = media_type_of(request.headers.get("content-type"))
        if media_type is None:
            return status_response(
                415, _RPC_INVALID_ARGUMENT, "Content-Type must be application/x-protobuf or application/json", JSON
            )
        future = None
        with ctx.writer.pending():
            outcome = await _decode(request, media_type)
            if isinstance(outcome, Response):
                return outcome
            decoded = outcome
            if decoded.table.num_rows:
                try:
                    future = ctx.writer.submit(table_kind, decoded.table)
                except OverloadedError as exc:
                    return _overloaded(exc, media_type, closing=ctx.writer.closing)
        if future is not None:
            try:
                await asyncio.wrap_future(future)  # acknowledge only what is committed
            except BadPayloadError as exc:  # found when the writer built the columns
                return status_response(400, _RPC_INVALID_ARGUMENT, str(exc), media_type)
            except StoreError as exc:
                return status_response(
                    503, _RPC_UNAVAILABLE, f"not stored, retry: {exc}", media_type, headers={"Retry-After": "5"}
                )
        rows = decoded.table.num_rows
        ctx.stats.add(**{f"{stats_prefix}_accepted": rows, f"{stats_prefix}_rejected": decoded.rejected})
        body_out = export_response_bytes(signal, media_type, decoded.rejected, list(decoded.errors))
        return Response(body_out, 200, media_type=media_type)

    async def _decode(request: Request, media_type: str) -> Any:
        """The decoded body (``DecodedSpans``/``DecodedMetrics``), or the error Response to send."""
        try:
            ctx.writer.check_capacity()  # refuse before reading a body we could not queue
            body = await read_body(request, ctx.config.max_body_bytes)
        except OverloadedError as exc:
            return _overloaded(exc, media_type, closing=ctx.writer.closing)
        except PayloadTooLargeError as exc:
            return status_response(413, _RPC_RESOURCE_EXHAUSTED, str(exc), media_type)
        except BadPayloadError as exc:
            return status_response(400, _RPC_INVALID_ARGUMENT, str(exc), media_type)
        try:
            if ctx.decode_pool is not None and body:
                return await asyncio.wrap_future(ctx.decode_pool.submit(signal, body, media_type))
            if len(body) > _INLINE_DECODE_BYTES:
                from starlette.concurrency import run_in_threadpool

                return await run_in_threadpool(
                    decode_payload, signal, body, media_type, ctx.normaliser, defer_columns=True
                )
            return decode_payload(signal, body, media_type, ctx.normaliser, defer_columns=True)
        except OverloadedError as exc:
            return _overloaded(exc, media_type, closing=ctx.writer.closing)
        except BadPayloadError as exc:
            return status_response(400, _RPC_INVALID_ARGUMENT, str(exc), media_type)
        except Exception as exc:  # boundary: client bytes crashed the decoder; a bug, but not the client's 5xx
            log.exception("decoder crashed on a %d-byte %s body", len(body), media_type)
            ctx.stats.add(decoder_crashes=1)
            message = f"undecodable payload ({type(exc).__name__})"
            return status_response(400, _RPC_INVALID_ARGUMENT, message, media_type)

    return export


async def _wrong_otlp_path(request: Request) -> Response:
    """POST / is what an exporter sends when given a bare ``http://host:4318`` as a traces endpoint."""
    message = (
        "POST /v1/traces or /v1/metrics: a signal-specific OTLP/HTTP endpoint is used unchanged, so append "
        "/v1/traces yourself (e.g. vLLM --otlp-traces-endpoint http://HOST:4318/v1/traces)"
    )
    return status_response(404, _RPC_NOT_FOUND, message, media_type_of(request.headers.get("content-type")) or JSON)


def _overloaded(exc: OverloadedError, media_type: str, *, closing: bool = False) -> Response:
    """429 when the queue is full; 503 while shutting down (another replica may take it)."""
    headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    return status_response(503 if closing else 429, _RPC_UNAVAILABLE, str(exc), media_type, headers=headers)


# -- the app ----------------------------------------------------------------------


def _route_modules(names: tuple[str, ...], *, optional: bool) -> list[Any]:
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if optional and exc.name == name:
                continue
            raise
    return modules


def build_app(
    ctx: ApiContext,
    route_modules: tuple[str, ...] = API_ROUTE_MODULES,
    optional_route_modules: tuple[str, ...] = OPTIONAL_ROUTE_MODULES,
) -> ASGIApp:
    """The ASGI app: OTLP endpoints, ``/healthz``, ``/metrics`` and every route module's routes."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "queued_rows": ctx.writer.queued_rows})

    async def metrics(request: Request) -> Response:
        text = ctx.stats.render_prometheus(queued_rows=ctx.writer.queued_rows, queue_max_rows=ctx.writer.queue_max_rows)
        if ctx.scraper is not None:
            text += ctx.scraper.render_prometheus()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    routes: list[BaseRoute] = [
        Route("/v1/traces", _otlp_endpoint(ctx, "traces"), methods=["POST"]),
        Route("/v1/metrics", _otlp_endpoint(ctx, "metrics"), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/", _wrong_otlp_path, methods=["POST"]),
    ]
    for module in [
        *_route_modules(route_modules, optional=False),
        *_route_modules(optional_route_modules, optional=True),
    ]:
        routes.extend(module.routes(ctx))
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, StoreError: _store_error})
    return AuthMiddleware(app, ctx.config)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _store_error(request: Request, exc: Exception) -> Response:
    log.error("API request %s failed: %s", request.url.path, exc)
    return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "5"})


# -- the runner -------------------------------------------------------------------


@dataclass(frozen=True)
class ServeAddresses:
    """Where a running server listens: ``http_url`` always, ``grpc_target`` None when disabled."""

    http_url: str
    grpc_target: str | None
    db: str


def _bind(host: str, port: int, what: str = "") -> socket.socket:
    """A bound (not yet listening) TCP socket; ConfigError naming ``what`` (e.g. "gRPC") when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        from sre_agent.errors import ConfigError

        purpose = f" for {what}" if what else ""
        raise ConfigError(f"cannot listen{purpose} on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def _hash_key(config: Config, store: Store) -> bytes:
    """The content-hash key: configured, else the store's own persistent key."""
    if config.hash_key:
        return config.hash_key.encode()
    key = getattr(store, "hash_key", None)
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    import os

    log.warning("store keeps no hash key and none is configured; content hashes use a per-run key")
    return os.urandom(32)


@contextlib.contextmanager
def open_context(config: Config, *, decode_workers: int = 0) -> Iterator[ApiContext]:
    """Open the store for writing, start the writer; on exit flush the queue and close the store.

    ``decode_workers`` > 0 decodes OTLP bodies in that many worker processes.

    Raises:
        StoreLockedError: another process holds ``config.db``.
    """
    from sre_agent.ingest.decode_pool import DecodePool
    from sre_agent.ingest.normalise import Normaliser
    from sre_agent.ingest.scrape import Scraper
    from sre_agent.store.embedded import Store

    store = Store.open(config.db)
    writer: Writer | None = None
    ctx: ApiContext | None = None
    pool: DecodePool | None = None
    scraper: Scraper | None = None
    try:
        stats = ReceiverStats()
        writer = Writer(
            store,
            queue_max_rows=config.queue_max_spans,
            batch_max_rows=config.batch_max_spans,
            flush_interval_s=config.flush_interval_s,
            stats=stats,
        )
        normaliser = Normaliser(
            keep_content=config.keep_content,
            max_attribute_bytes=config.max_attribute_bytes,
            hash_key=_hash_key(config, store),
        )
        if decode_workers > 0:
            pool = DecodePool(
                decode_workers,
                keep_content=normaliser.keep_content,
                max_attribute_bytes=normaliser.max_attribute_bytes,
                hash_key=normaliser.hash_key,
            )
            pool.warm_up()
        if config.scrape:
            active_writer = writer
            scraper = Scraper(
                config.scrape,
                interval_s=config.scrape_interval_s,
                submit=lambda table: active_writer.submit("metric_points", table),
                normaliser=normaliser,
                max_body_bytes=config.max_body_bytes,
            )
        ctx = ApiContext(
            config=config,
            store=store,
            writer=writer,
            stats=stats,
            normaliser=normaliser,
            decode_pool=pool,
            scraper=scraper,
        )
        writer.start()
        if scraper is not None:
            scraper.start()
        yield ctx
    finally:
        if scraper is not None:
            scraper.close()  # before the writer: a scrape in progress still gets its commit
        if pool is not None:
            pool.close()
        if writer is not None:
            writer.close()
        if ctx is not None:
            ctx.close()
        store.close()


class _Server(uvicorn.Server):
    """uvicorn that does not re-raise the signal after shutting down, so a clean stop exits 0.

    ``on_signal`` runs on SIGTERM/SIGINT (e.g. to stop gRPC intake at the
    same time); ``on_ready`` runs once the socket is accepting.
    """

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None], on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready
        self._on_signal = on_signal

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(signum: int, frame: Any) -> None:
            if self.should_exit:
                self.force_exit = True  # a second signal: stop waiting for in-flight requests
            self.should_exit = True
            threading.Thread(target=self._on_signal, name="sre-agent-stop", daemon=True).start()

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            self._on_ready()


def serve(
    config: Config,
    *,
    on_ready: Callable[[ServeAddresses], None] | None = None,
    route_modules: tuple[str, ...] = API_ROUTE_MODULES,
    decode_workers: int = 0,
) -> None:
    """Run the receivers and the API until SIGTERM/SIGINT, then flush and return.

    Opens the store for writing (raising StoreLockedError when another
    process holds it), starts the writer thread, the gRPC server (unless
    ``config.grpc_port`` is 0) and uvicorn. On a signal: stop accepting,
    finish in-flight requests (each waits for its commit), commit what is
    queued, close the store. A second signal stops waiting for in-flight requests.
    """
    grpc_server: Any = None
    # Ports first: a busy port must fail before the store file is created, and a busy gRPC port
    # must be one readable line rather than gRPC's own C++ log line.
    http_sock = _bind(config.host, config.http_port)
    try:
        if config.grpc_port:
            _bind(config.host, config.grpc_port, "gRPC").close()  # gRPC binds it again itself
        with open_context(config, decode_workers=decode_workers) as ctx:
            try:
                app = build_app(ctx, route_modules)
                grpc_target = None
                if config.grpc_port:
                    from sre_agent.ingest.grpc_server import start_grpc_server

                    grpc_server, grpc_port = start_grpc_server(ctx, config.host, config.grpc_port)
                    grpc_target = f"{config.host}:{grpc_port}"
                host = f"[{config.host}]" if ":" in config.host else config.host
                addresses = ServeAddresses(
                    http_url=f"http://{host}:{http_sock.getsockname()[1]}", grpc_target=grpc_target, db=config.db
                )

                def stop_grpc() -> None:
                    # gRPC stops taking new calls; its in-flight calls finish (each waits for its commit).
                    if grpc_server is not None:
                        grpc_server.stop(grace=10.0).wait(11.0)

                server = _Server(
                    uvicorn.Config(
                        app,
                        log_level="warning",
                        lifespan="off",
                        timeout_graceful_shutdown=30,
                        access_log=False,
                    ),
                    on_ready=lambda: on_ready(addresses) if on_ready is not None else None,
                    on_signal=stop_grpc,
                )
                server.run(sockets=[http_sock])
                stop_grpc()
            finally:
                if grpc_server is not None:
                    grpc_server.stop(grace=None)
    finally:
        http_sock.close()
