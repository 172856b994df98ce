"""A fake clock and a scripted OpenAI-compatible httpx transport for policy tests (no real time passes)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class FakeClock:
    """Monotonic seconds that move only when told; ``sleep`` advances it and records the waits."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass(frozen=True)
class Fault:
    """One scripted answer of the fake server: ``kind`` and how many seconds it takes."""

    kind: str
    latency_s: float = 0.5
    retry_after_s: float | None = None


def _chat_body(request_body: dict[str, Any], fault: Fault) -> dict[str, Any]:
    cap = int(request_body.get("max_completion_tokens", 1024))
    prompt = max(len(json.dumps(request_body["messages"])) // 4, 1)
    message: dict[str, Any] = {"role": "assistant", "content": "answer"}
    finish = "stop"
    output, reasoning = min(5, cap), 0
    if fault.kind == "truncate":
        message["content"], finish, output, reasoning = "", "length", cap, cap
    elif fault.kind == "refusal":
        message["content"], message["refusal"] = "", "no"
    elif fault.kind in ("tool_call", "bad_tool_call"):
        message["content"], finish = None, "tool_calls"
        args = '{"ticket": "INC-1"' if fault.kind == "bad_tool_call" else '{"ticket": "INC-1"}'
        call_id = f"call_{len(request_body['messages'])}"
        message["tool_calls"] = [{"id": call_id, "type": "function", "function": {"name": "page", "arguments": args}}]
    elif fault.kind == "empty":
        message["content"] = ""
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        },
    }


class ScriptedTransport(httpx.MockTransport):
    """Answers each request with the next :class:`Fault` (the last repeats), advancing ``clock``.

    A fault slower than the request's read timeout advances the clock by the timeout and raises
    ``httpx.ReadTimeout``, as a real client would.
    """

    def __init__(self, faults: list[Fault], clock: FakeClock) -> None:
        self.faults = faults
        self.clock = clock
        self.requests: list[dict[str, Any]] = []
        super().__init__(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        fault = self.faults[min(len(self.requests) - 1, len(self.faults) - 1)]
        timeout = request.extensions.get("timeout", {}).get("read")
        latency = math.inf if fault.kind == "timeout" else fault.latency_s
        assert timeout is not None or latency != math.inf, "a stalled request needs a timeout"
        if timeout is not None and latency > timeout:
            self.clock.now += timeout
            raise httpx.ReadTimeout("scripted stall", request=request)
        self.clock.now += fault.latency_s
        if fault.kind == "rate_limit":
            headers = {} if fault.retry_after_s is None else {"retry-after": str(fault.retry_after_s)}
            return httpx.Response(429, json={"error": {"code": "rate_limit_exceeded"}}, headers=headers)
        if fault.kind == "server_error":
            return httpx.Response(503, json={"error": {"type": "server_error"}})
        if fault.kind == "context_overflow":
            return httpx.Response(400, json={"error": {"code": "context_length_exceeded"}})
        return httpx.Response(200, json=_chat_body(body, fault))


FAULT_KINDS = (
    "ok",
    "rate_limit",
    "server_error",
    "truncate",
    "refusal",
    "tool_call",
    "bad_tool_call",
    "context_overflow",
    "empty",
    "timeout",
)
