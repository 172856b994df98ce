"""Provider wire formats: request bodies and streamed-response assembly (pure, no I/O).

The engine calls OpenAI-compatible and Anthropic-compatible endpoints directly
with httpx (no vendor SDK: their newest releases depend on ``httpx2`` and retry
on their own). Streamed OpenAI chat responses are folded back into the shape of
a non-streaming body so one classification table serves both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sre_agent.policy.recovery import ChatRequest, Target

__all__ = [
    "AnthropicStreamAccumulator",
    "CallTemplate",
    "HttpCall",
    "ResponsesStreamAccumulator",
    "SseAccumulator",
    "StreamAccumulator",
    "anthropic_messages",
    "build_call",
    "call_template",
    "input_tokens_bound",
    "stream_accumulator",
]

# json.dumps(..., ensure_ascii=False) builds a new JSONEncoder per call; the same settings, built once.
_JSON = json.JSONEncoder(ensure_ascii=False)

_PROVIDER_NAMES = {"openai-chat": "openai", "openai-responses": "openai", "anthropic": "anthropic"}


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One POST to send: URL, headers and JSON body."""

    url: str
    headers: dict[str, str]
    body: dict[str, Any]
    provider_name: str


def input_tokens_bound(request: ChatRequest) -> int:
    """An upper bound on the prompt's tokens: UTF-8 bytes of the JSON plus template overhead.

    A BPE token covers at least one byte, so the byte count of the messages (and tool
    definitions) bounds their token count; 16 + 8 per message covers chat-template tokens.
    """
    size = _utf8_len(_JSON.encode(request.messages))
    if request.tools:
        size += _utf8_len(_JSON.encode(request.tools))
    return size + 16 + 8 * len(request.messages)


def _utf8_len(text: str) -> int:
    # An ASCII string's UTF-8 length is its length; isascii() is O(1) on CPython's compact strings.
    return len(text) if text.isascii() else len(text.encode())


@dataclass(slots=True)
class CallTemplate:
    """Everything of an :class:`HttpCall` except the output cap, built once per request and target.

    Retries of one request differ at most in the output cap, so the engine builds the URL,
    headers and body once and :meth:`call` fills the cap in. ``cap_key`` is the body key of
    the cap; the body holds a placeholder there so that the key order, and so the JSON sent,
    is the same as a body built from scratch. The calls it returns share the message list and
    nested dicts and must be treated as read-only (httpx only serialises them).
    """

    url: str
    headers: dict[str, str]
    body: dict[str, Any]
    cap_key: str
    provider_name: str
    last: HttpCall | None = None
    last_cap: int | None = None

    def call(self, max_output_tokens: int) -> HttpCall:
        """The call with the output cap ``max_output_tokens``; the previous one again when the cap is unchanged."""
        last = self.last
        cap = self.last_cap
        if last is not None and cap == max_output_tokens and type(cap) is type(max_output_tokens):
            return last  # a same-cap retry resends the identical request: no new body
        body = self.body.copy()
        body[self.cap_key] = max_output_tokens
        last = self.last = HttpCall(self.url, self.headers.copy(), body, self.provider_name)
        self.last_cap = max_output_tokens
        return last


def call_template(target: Target, request: ChatRequest) -> CallTemplate:
    """The cap-independent part of the call for ``request`` on ``target``."""
    base = target.base_url.rstrip("/")
    headers = {"content-type": "application/json", **dict(target.headers)}
    fmt = target.provider_format
    messages = list(request.messages)
    body: dict[str, Any]
    if fmt == "openai-chat":
        cap_key = "max_completion_tokens"
        body = {"model": target.model, "messages": messages, cap_key: 0}
        if request.reasoning_effort is not None:
            body["reasoning_effort"] = request.reasoning_effort
        if request.tools:
            body["tools"] = list(request.tools)
        if request.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        url = f"{base}/chat/completions"
    elif fmt == "openai-responses":
        cap_key = "max_output_tokens"
        body = {"model": target.model, "input": messages, cap_key: 0}
        if request.reasoning_effort is not None:
            body["reasoning"] = {"effort": request.reasoning_effort}
        if request.tools:
            body["tools"] = list(request.tools)
        if request.stream:
            body["stream"] = True
        url = f"{base}/responses"
    elif fmt == "anthropic":
        cap_key = "max_tokens"
        system = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
        body = {"model": target.model, "messages": anthropic_messages(messages), cap_key: 0}
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [_anthropic_tool(tool) for tool in request.tools]
        if request.reasoning_effort is not None:
            body["output_config"] = {"effort": request.reasoning_effort}
        if request.stream:
            body["stream"] = True
        headers.setdefault("anthropic-version", "2023-06-01")
        url = f"{base}/messages"
    else:
        raise ValueError(f"cannot send provider format {fmt!r}")
    return CallTemplate(url, headers, body, cap_key, _PROVIDER_NAMES[fmt])


def anthropic_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """An OpenAI-shaped conversation as Anthropic Messages (system messages go to ``system``).

    The engine keeps one conversation whatever the target, so a fallback to another format
    resends the same turns: assistant ``tool_calls`` become ``tool_use`` blocks, and
    consecutive ``tool`` messages one user message of ``tool_result`` blocks.
    """
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] | None = None  # the tool_result blocks of the last message, if it is one
    for message in messages:
        role = message.get("role")
        if role == "system":
            continue
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id", "")),
                     "content": str(message.get("content", ""))}  # fmt: skip
            if results is None:
                results = []
                out.append({"role": "user", "content": results})
            results.append(block)
            continue
        results = None
        if role == "assistant" and message.get("tool_calls"):
            text = message.get("content")
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            for call in message["tool_calls"]:
                function = call.get("function") or {}
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    arguments = {}
                blocks.append({"type": "tool_use", "id": call.get("id", ""), "name": function.get("name", ""),
                               "input": arguments})  # fmt: skip
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append(dict(message))
    return out


def _anthropic_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool as an Anthropic tool; a tool already in Anthropic's shape passes through."""
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, Mapping):
        return dict(tool)
    out = {"name": function.get("name", ""), "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        out["description"] = function["description"]
    return out


def build_call(target: Target, request: ChatRequest, max_output_tokens: int) -> HttpCall:
    """The HTTP call for ``request`` on ``target`` with the output cap ``max_output_tokens``."""
    return call_template(target, request).call(max_output_tokens)


class SseAccumulator:
    """Folds OpenAI chat-completion ``data:`` events into one non-streaming body.

    A stream cut before any ``finish_reason`` leaves ``finish_reason`` None, which the
    classifier treats as ``invalid_output``: a truncated stream is never a success.
    """

    def __init__(self) -> None:
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False

    def feed(self, lines: Iterable[str]) -> None:
        """Consume decoded SSE lines (blank lines and comments are ignored)."""
        for line in lines:
            self.feed_line(line)

    def feed_line(self, line: str) -> None:
        """Consume one SSE line; fields of the wrong type are skipped, never raised on."""
        if line.startswith("data:") and line[5:].strip() == "[DONE]":
            self.done = True
            return
        event = _data_event(line)
        if event is None:
            return
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        for choice in _dicts(event.get("choices")):
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            if isinstance(delta.get("refusal"), str):
                self.refusal.append(delta["refusal"])
            for call in _dicts(delta.get("tool_calls")):
                slot = self.tool_calls.setdefault(
                    _index(call.get("index")), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if isinstance(call.get("id"), str) and call["id"]:
                    slot["id"] = call["id"]
                function = call.get("function")
                if isinstance(function, dict):
                    for key in ("name", "arguments"):
                        if isinstance(function.get(key), str):
                            slot["function"][key] += function[key]
            if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
                self.finish_reason = choice["finish_reason"]

    def body(self) -> dict[str, Any]:
        """The equivalent non-streaming response body."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        body: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}]}
        if self.usage is not None:
            body["usage"] = self.usage
        return body


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON array (nothing when ``value`` is not one)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _index(value: Any, default: int = 0) -> int:
    """A stream event's ``index``; ``default`` when it is not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _data_event(line: str) -> dict[str, Any] | None:
    """The JSON object of an SSE ``data:`` line; None for other lines and for non-objects."""
    if not line.startswith("data:"):
        return None
    try:
        event = json.loads(line[5:].strip())
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


class ResponsesStreamAccumulator:
    """Keeps the final response object of an OpenAI Responses event stream.

    ``response.completed``, ``response.incomplete`` and ``response.failed`` carry the whole
    response; a stream cut before any of them yields ``{"status": None}``, which the
    classifier treats as ``invalid_output``.
    """

    _FINAL = ("response.completed", "response.incomplete", "response.failed")

    def __init__(self) -> None:
        self.final: dict[str, Any] | None = None

    def feed_line(self, line: str) -> None:
        """Consume one SSE line (``event:`` lines are redundant with the data's ``type``)."""
        event = _data_event(line)
        if event is not None and event.get("type") in self._FINAL and isinstance(event.get("response"), dict):
            self.final = event["response"]

    def body(self) -> dict[str, Any]:
        """The final response object, or a status-less body when the stream ended early."""
        return self.final if self.final is not None else {"status": None, "output": []}


class AnthropicStreamAccumulator:
    """Folds an Anthropic Messages event stream into the equivalent non-streaming message.

    ``message_start`` carries the message with empty content; each content block is a
    ``content_block_start``, its deltas (``text_delta``, ``thinking_delta``,
    ``input_json_delta``) and a ``content_block_stop``; ``message_delta`` sets
    ``stop_reason`` and the cumulative usage. A stream cut before ``message_delta``
    leaves ``stop_reason`` None (``invalid_output``), and an ``error`` event (e.g.
    ``overloaded_error``, a 529 outside a stream) becomes the error body it stands for.
    """

    def __init__(self) -> None:
        self.message: dict[str, Any] = {"type": "message", "role": "assistant", "content": [], "stop_reason": None}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.tool_json: dict[int, list[str]] = {}
        self.error: dict[str, Any] | None = None

    def feed_line(self, line: str) -> None:
        """Consume one SSE line (``event:`` lines are redundant with the data's ``type``)."""
        event = _data_event(line)
        if event is None:
            return
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = {**event["message"], "content": []}
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self.blocks[_index(event.get("index"), len(self.blocks))] = dict(event["content_block"])
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            self._delta(_index(event.get("index")), event["delta"])
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                self.message.update({k: v for k, v in delta.items() if k in ("stop_reason", "stop_sequence")})
            if isinstance(event.get("usage"), dict):  # cumulative: it replaces, field by field
                usage = self.message.get("usage")
                self.message["usage"] = {**(usage if isinstance(usage, dict) else {}), **event["usage"]}
        elif kind == "error" and isinstance(event.get("error"), dict):
            self.error = event["error"]

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        for delta_type, field in (("text_delta", "text"), ("thinking_delta", "thinking")):
            if kind == delta_type and isinstance(delta.get(field), str):
                before = block.get(field)
                block[field] = (before if isinstance(before, str) else "") + delta[field]
        if kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self.tool_json.setdefault(index, []).append(delta["partial_json"])

    def body(self) -> dict[str, Any]:
        """The equivalent non-streaming body (an error body when the stream reported one)."""
        if self.error is not None:
            return {"type": "error", "error": self.error}
        content = []
        for index in sorted(self.blocks):
            block = dict(self.blocks[index])
            if index in self.tool_json:
                # Unparseable tool input stays a string: the classifier reports the malformed call.
                text = "".join(self.tool_json[index])
                try:
                    block["input"] = json.loads(text) if text else {}
                except ValueError:
                    block["input"] = text
            content.append(block)
        return {**self.message, "content": content}


StreamAccumulator = SseAccumulator | ResponsesStreamAccumulator | AnthropicStreamAccumulator


def stream_accumulator(provider_format: str) -> StreamAccumulator:
    """The accumulator for a streamed response of ``provider_format`` (OpenAI chat or Responses, Anthropic)."""
    if provider_format == "openai-responses":
        return ResponsesStreamAccumulator()
    if provider_format == "anthropic":
        return AnthropicStreamAccumulator()
    return SseAccumulator()
