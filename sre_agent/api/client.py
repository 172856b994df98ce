"""A small client for the sre-agent HTTP API, used by CLI commands in ``--url`` mode.

Errors are :class:`~sre_agent.errors.RemoteError` with a message a user can
act on (server unreachable, wrong token, the server's own error text).
The ``httpx.Client`` is injectable so tests can use ``httpx.MockTransport``
or ``httpx.ASGITransport``.
"""

from __future__ import annotations

from typing import Any

import httpx

from sre_agent.config import Config
from sre_agent.errors import RemoteError

__all__ = ["get_json", "post_json"]

DEFAULT_TIMEOUT_S = 60.0


def _headers(config: Config) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"
    return headers


def _url(config: Config, path: str) -> str:
    if not config.url:
        raise RemoteError("no server URL configured (use --url or SRE_AGENT_URL)")
    return config.url.rstrip("/") + "/" + path.lstrip("/")


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            if isinstance(body.get(key), str):
                return str(body[key])
    return str(body)[:500]


def _request(
    config: Config,
    method: str,
    path: str,
    *,
    client: httpx.Client | None,
    timeout_s: float,
    **kwargs: Any,
) -> dict[str, Any]:
    url = _url(config, path)
    owned = client is None
    http = client if client is not None else httpx.Client(timeout=timeout_s)
    try:
        response = http.request(method, url, headers=_headers(config), **kwargs)
    except httpx.TimeoutException as exc:
        raise RemoteError(f"{method} {url}: no answer within {timeout_s:g} s") from exc
    except httpx.HTTPError as exc:
        raise RemoteError(f"cannot reach sre-agent at {config.url}: {exc}") from exc
    finally:
        if owned:
            http.close()
    if response.status_code == 401:
        raise RemoteError(f"{method} {url}: the server needs a valid token (--token or SRE_AGENT_TOKEN)")
    if response.status_code >= 400:
        raise RemoteError(f"{method} {url}: HTTP {response.status_code}: {_error_text(response)}", response.status_code)
    try:
        body = response.json()
    except ValueError as exc:
        raise RemoteError(f"{method} {url}: the answer is not JSON") from exc
    if not isinstance(body, dict):
        raise RemoteError(f"{method} {url}: expected a JSON object, got {type(body).__name__}")
    return body


def get_json(
    config: Config,
    path: str,
    params: dict[str, Any] | None = None,
    *,
    client: httpx.Client | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """GET ``config.url + path`` and return the JSON object it answers.

    Raises:
        RemoteError: unreachable server, timeout, non-2xx answer or non-JSON body.
    """
    return _request(config, "GET", path, client=client, timeout_s=timeout_s, params=params)


def post_json(
    config: Config,
    path: str,
    payload: Any,
    *,
    client: httpx.Client | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """POST ``payload`` as JSON to ``config.url + path`` and return the JSON object answered.

    Raises:
        RemoteError: unreachable server, timeout, non-2xx answer or non-JSON body.
    """
    return _request(config, "POST", path, client=client, timeout_s=timeout_s, json=payload)
