"""Bearer-token authentication for the receivers and the API.

``config.token`` is the admin token (ingest, writes, every tenant);
``config.tenant_tokens`` maps read-only tokens to the ``tenant.id`` they are
confined to. With neither set the server is open and everyone is admin.
"""

from __future__ import annotations

import contextvars
import hmac
from dataclasses import dataclass
from typing import Any

from sre_agent.config import Config

__all__ = ["CURRENT_PRINCIPAL", "Principal", "authenticate", "bearer_token"]


@dataclass(frozen=True)
class Principal:
    """Who made the request: an admin (``tenant`` None) or a tenant-scoped reader."""

    tenant: str | None


# Set by the auth middleware for the duration of one request; copied into the
# worker threads Starlette runs sync endpoints in.
CURRENT_PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "sre_agent_principal", default=None
)


def bearer_token(headers: Any) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (any mapping with ``get``), else None."""
    value = headers.get("authorization")
    if not value:
        return None
    scheme, _, token = str(value).partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def authenticate(config: Config, token: str | None) -> Principal | None:
    """Map a bearer token to a principal; None when auth is on and the token is unknown.

    Auth is off (everyone is admin) when neither ``config.token`` nor
    ``config.tenant_tokens`` is set.
    """
    if not config.token and not config.tenant_tokens:
        return Principal(tenant=None)
    if token is None:
        return None
    if config.token and hmac.compare_digest(token.encode(), config.token.encode()):
        return Principal(tenant=None)
    for candidate, tenant in config.tenant_tokens.items():
        if hmac.compare_digest(token.encode(), candidate.encode()):
            return Principal(tenant=tenant)
    return None
