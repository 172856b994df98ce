"""Tool-call idempotency: a side-effecting tool runs at most once per logical request.

A retry after a tool error (or after a timeout, a 5xx, a fallback) makes the
model emit its tool calls again, usually with *new* call ids. The ledger keys
each call twice: by the provider's call id and by the tool name plus its
canonical JSON arguments, scoped to the logical request. A side-effecting
call seen under either key is answered from the ledger instead of running
again. A side-effecting call that raised is recorded as ``unknown``: the side
effect may have happened, so it is never re-run either (the error is replayed).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sre_agent.policy.outcome import ToolCall

__all__ = ["LedgerEntry", "ToolLedger"]


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One executed tool call. ``error`` is the message when the tool raised (``result`` is then None)."""

    key: str
    name: str
    result: Any
    error: str | None
    executions: int


def _content_key(scope: str, call: ToolCall) -> str:
    canonical = json.dumps(call.arguments, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(f"{call.name}\x00{canonical}".encode()).hexdigest()[:32]
    return f"{scope}/args/{digest}"


class ToolLedger:
    """Records executed tool calls; thread-safe; one ledger may serve many requests (keys are scoped)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, LedgerEntry] = {}
        self._running: set[str] = set()
        self.executions = 0

    def keys_for(self, scope: str, call: ToolCall) -> tuple[str, str]:
        """The (call-id key, content key) pair for ``call`` within ``scope`` (a logical request id)."""
        return f"{scope}/id/{call.call_id}", _content_key(scope, call)

    def lookup(self, scope: str, call: ToolCall) -> LedgerEntry | None:
        """The recorded execution of ``call`` (by id or by content), or None when it never ran."""
        with self._lock:
            for key in self.keys_for(scope, call):
                entry = self._entries.get(key)
                if entry is not None:
                    return entry
        return None

    def execute(
        self, scope: str, call: ToolCall, tool: Callable[[dict[str, Any]], Any], side_effecting: bool = True
    ) -> LedgerEntry:
        """Run ``tool(call.arguments)`` unless a side-effecting twin already ran in ``scope``.

        Read-only tools (``side_effecting=False``) simply run again. Concurrent duplicates of a
        side-effecting call wait for nothing: the second caller gets an ``in flight`` entry
        with an error instead of a second execution.
        """
        id_key, content_key = self.keys_for(scope, call)
        if side_effecting:
            with self._lock:
                for key in (id_key, content_key):
                    if key in self._entries:
                        return self._entries[key]
                    if key in self._running:
                        return LedgerEntry(key, call.name, None, "in flight: not executed twice", 0)
                self._running.update((id_key, content_key))
        result: Any = None
        error: str | None = None
        try:
            result = tool(dict(call.arguments or {}))
        except Exception as exc:  # a tool is user code: record, never re-run, never crash the engine
            error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.executions += 1
            entry = LedgerEntry(content_key, call.name, result, error, 1)
            if side_effecting:
                self._entries[id_key] = entry
                self._entries[content_key] = entry
                self._running.difference_update((id_key, content_key))
        return entry
