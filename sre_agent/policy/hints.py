"""Server retry hints in HTTP response headers: Retry-After (and its millisecond forms) and x-should-retry.

Pure functions over a header mapping: a plain ``dict`` in any case, or a case-insensitive
mapping such as ``httpx.Headers``. :func:`failure_hints` reads both hints in one pass and is
what :func:`sre_agent.policy.outcome.classify` calls for every 4xx/5xx answer.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

__all__ = ["failure_hints", "parse_retry_after", "should_retry_header"]

_RETRY_AFTER_MS = ("retry-after-ms", "x-ms-retry-after-ms")
_RETRY_AFTER_NAMES = frozenset({*_RETRY_AFTER_MS, "retry-after"})


def parse_retry_after(headers: Mapping[str, str], now_s: float | None = None) -> float | None:
    """The server's requested wait in seconds, or None when absent or unparsable.

    Reads ``retry-after-ms`` and ``x-ms-retry-after-ms`` (milliseconds) first, as the
    official SDKs do, then ``Retry-After`` as seconds or an HTTP date (relative to
    ``now_s``, Unix seconds, default the wall clock). Negative waits become 0.
    """
    # httpx.Headers is already case-insensitive; a plain mapping is lower-cased once.
    lower = headers if hasattr(headers, "multi_items") else {k.lower(): v for k, v in headers.items()}
    return _retry_after(lower, now_s)


def _retry_after(lower: Mapping[str, str], now_s: float | None) -> float | None:
    """:func:`parse_retry_after` on headers that answer lower-case names."""
    for name in _RETRY_AFTER_MS:
        raw = lower.get(name)
        if raw is not None:
            try:
                return max(float(raw) / 1000.0, 0.0)
            except ValueError:
                pass
    raw = lower.get("retry-after")
    if raw is None:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    now = time.time() if now_s is None else now_s
    return max(when.timestamp() - now, 0.0)


def should_retry_header(headers: Mapping[str, str]) -> bool | None:
    """The first ``x-should-retry`` header (any case) as a bool ("true" in any case), or None when absent."""
    for key, value in headers.items():
        if key.lower() == "x-should-retry":
            return value.strip().lower() == "true"
    return None


def failure_hints(headers: Mapping[str, str], now_s: float | None = None) -> tuple[float | None, bool | None]:
    """``(parse_retry_after(headers, now_s), should_retry_header(headers))`` with one pass over a plain mapping.

    A plain mapping is lower-cased key by key either way; this keeps only the names that
    matter instead of building a full lower-cased copy and then scanning again. Duplicates
    that differ in case resolve the same way: the last for Retry-After, the first for x-should-retry.
    """
    if type(headers) is not dict and hasattr(headers, "multi_items"):
        return parse_retry_after(headers, now_s), should_retry_header(headers)
    hints: dict[str, str] = {}
    should_retry: bool | None = None
    for key, value in headers.items():
        name = key.lower()
        if name in _RETRY_AFTER_NAMES:
            hints[name] = value
        elif should_retry is None and name == "x-should-retry":
            should_retry = value.strip().lower() == "true"
    return (_retry_after(hints, now_s) if hints else None), should_retry
