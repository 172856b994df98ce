"""A fault-injecting OpenAI/Anthropic-compatible server for tests and the README example.

Each *scenario* is a script: a list of :class:`Step` consumed one per request
(the last step repeats when the script runs out). Endpoints, under
``/{scenario}/v1`` (or ``/v1`` for the scenario ``default``):

- ``POST /chat/completions`` (OpenAI chat, streaming with ``"stream": true``),
- ``POST /responses`` (OpenAI Responses, streaming with ``"stream": true``),
- ``POST /messages`` (Anthropic Messages).

``GET /_log`` returns every request received (scenario, path, body) so tests can
check what the client sent (e.g. that no exhausted request was resent unchanged).

Run it by hand::

    python -m sre_agent.replays.fault_server --port 8000 \
        --script '[{"kind": "rate_limit", "retry_after_s": 1}, {"kind": "ok", "text": "42"}]'

or in-process with :func:`serve_in_thread` (an ephemeral port on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["Step", "create_app", "serve_in_thread"]

KINDS = (
    "ok",
    "rate_limit",
    "server_error",
    "stall",
    "truncate",
    "refusal",
    "tool_call",
    "context_overflow",
    "cut",
    "overloaded",
)


@dataclass(frozen=True)
class Step:
    """One scripted answer.

    Attributes:
        kind: one of ``KINDS``: ``ok`` (an answer), ``rate_limit`` (429 + Retry-After), ``server_error``
            (``status``, default 503), ``stall`` (sleep ``stall_s`` then answer ``ok``), ``truncate`` (output
            cap hit with every token spent on reasoning), ``refusal``, ``tool_call`` (``tool_name`` with
            ``tool_arguments``; ``malformed`` sends broken JSON), ``context_overflow`` (400), ``cut``
            (a stream cut before any finish reason), ``overloaded`` (Anthropic's overloaded_error: a
            529, or mid-stream an ``error`` event after some text, still HTTP 200).
        text: the answer text for ``ok``/``stall``.
        reasoning_tokens: reasoning tokens reported on an ``ok`` answer.
        retry_after_s: Retry-After value for ``rate_limit`` (None: no header).
        status: HTTP status for ``server_error``.
        stall_s: seconds to wait before answering (any kind; for streams, between chunks).
        trickle_s: seconds between the pieces of a non-streamed answer, sent in eight pieces (a
            server that trickles its body, each piece well inside a read timeout).
        tool_name / tool_arguments / malformed: the tool call for ``tool_call``.
    """

    kind: str = "ok"
    text: str = "42"
    reasoning_tokens: int = 0
    retry_after_s: float | None = 1.0
    status: int = 503
    stall_s: float = 0.0
    trickle_s: float = 0.0
    tool_name: str = "create_ticket"
    tool_arguments: Mapping[str, Any] = field(default_factory=lambda: {"title": "disk full"})
    malformed: bool = False

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Step:
        """A step from JSON; unknown kinds are rejected."""
        step = cls(**dict(raw))
        if step.kind not in KINDS:
            raise ValueError(f"unknown step kind {step.kind!r}; choose one of {', '.join(KINDS)}")
        return step


class _Scripts:
    def __init__(self, scripts: Mapping[str, Sequence[Step]]) -> None:
        self._scripts = {name: list(steps) for name, steps in scripts.items()}
        self._cursor: dict[str, int] = {}
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def next(self, scenario: str, path: str, body: Any) -> Step:
        with self._lock:
            self.log.append({"scenario": scenario, "path": path, "body": body, "time": time.time()})
            steps = self._scripts.get(scenario) or [Step()]
            index = self._cursor.get(scenario, 0)
            self._cursor[scenario] = index + 1
            return steps[min(index, len(steps) - 1)]


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    messages = body.get("messages", body.get("input", []))
    return max(len(json.dumps(messages)) // 4, 1)


def _cap(body: Mapping[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        if isinstance(body.get(key), int):
            return int(body[key])
    return 4096


_OVERLOADED = {"type": "overloaded_error", "message": "Overloaded"}


def _error(step: Step) -> Response | None:
    if step.kind == "rate_limit":
        headers = {} if step.retry_after_s is None else {"retry-after": f"{step.retry_after_s:g}"}
        return JSONResponse(
            {"error": {"type": "rate_limit_error", "code": "rate_limit_exceeded", "message": "slow down"}},
            status_code=429,
            headers=headers,
        )
    if step.kind == "server_error":
        return JSONResponse({"error": {"type": "server_error", "message": "upstream failed"}}, status_code=step.status)
    if step.kind == "overloaded":
        return JSONResponse({"type": "error", "error": _OVERLOADED}, status_code=529)
    if step.kind == "context_overflow":
        return JSONResponse(
            {"error": {"code": "context_length_exceeded", "message": "maximum context length exceeded"}},
            status_code=400,
        )
    return None


def _tokens(step: Step, body: Mapping[str, Any]) -> tuple[int, int]:
    """(output tokens, reasoning tokens) for the step, within the request's cap."""
    cap = _cap(body)
    if step.kind == "truncate":
        return cap, cap
    output = min(step.reasoning_tokens + max(len(step.text) // 4, 1), cap)
    return output, min(step.reasoning_tokens, output)


def _tool_args(step: Step) -> str:
    return '{"title": "disk' if step.malformed else json.dumps(dict(step.tool_arguments))


def _openai_chat(step: Step, body: Mapping[str, Any]) -> dict[str, Any]:
    output, reasoning = _tokens(step, body)
    message: dict[str, Any] = {"role": "assistant", "content": step.text, "refusal": None}
    finish = "stop"
    if step.kind == "truncate":
        message["content"], finish = "", "length"
    elif step.kind == "refusal":
        message["content"], message["refusal"] = "", "I can't help with that."
    elif step.kind == "tool_call":
        message["content"], finish = None, "tool_calls"
        call_id = f"call_{len(json.dumps(body.get('messages', [])))}"
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": step.tool_name, "arguments": _tool_args(step)}}
        ]
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "model": body.get("model", "fault"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": _prompt_tokens(body),
            "completion_tokens": output,
            "total_tokens": _prompt_tokens(body) + output,
            "completion_tokens_details": {"reasoning_tokens": reasoning},
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }


def _openai_responses(step: Step, body: Mapping[str, Any]) -> dict[str, Any]:
    output, reasoning = _tokens(step, body)
    status, incomplete, items = "completed", None, [{"type": "output_text", "text": step.text}]
    if step.kind == "truncate":
        status, incomplete, items = "incomplete", {"reason": "max_output_tokens"}, []
    elif step.kind == "refusal":
        items = [{"type": "refusal", "refusal": "I can't help with that."}]
    out: list[dict[str, Any]] = [{"type": "message", "role": "assistant", "content": items}]
    if step.kind == "tool_call":
        out = [{"type": "function_call", "call_id": "call_1", "name": step.tool_name, "arguments": _tool_args(step)}]
    return {
        "id": "resp-fault",
        "object": "response",
        "status": status,
        "incomplete_details": incomplete,
        "output": out,
        "usage": {
            "input_tokens": _prompt_tokens(body),
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "input_tokens_details": {"cached_tokens": 0},
        },
    }


def _anthropic(step: Step, body: Mapping[str, Any]) -> dict[str, Any]:
    output, reasoning = _tokens(step, body)
    stop = "end_turn"
    content: list[dict[str, Any]] = [{"type": "text", "text": step.text}]
    if step.kind == "truncate":
        stop, content = "max_tokens", [{"type": "thinking", "thinking": "..."}]
    elif step.kind == "refusal":
        stop, content = "refusal", []
    elif step.kind == "tool_call":
        stop = "tool_use"
        content = [{"type": "tool_use", "id": "toolu_1", "name": step.tool_name, "input": dict(step.tool_arguments)}]
    return {
        "id": "msg-fault",
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": stop,
        "usage": {
            "input_tokens": _prompt_tokens(body),
            "output_tokens": output,
            "output_tokens_details": {"thinking_tokens": reasoning},
        },
    }


async def _stream_chat(step: Step, body: Mapping[str, Any]) -> AsyncIterator[bytes]:
    full = _openai_chat(step, body)
    choice = full["choices"][0]
    message = choice["message"]
    text = message.get("content") or ""
    head = {"id": full["id"], "object": "chat.completion.chunk", "model": full["model"]}
    pieces = [text[i : i + 8] for i in range(0, len(text), 8)] or [""]
    for piece in pieces:
        delta = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        yield f"data: {json.dumps({**head, **delta})}\n\n".encode()
        if step.stall_s:
            await asyncio.sleep(step.stall_s)
    if step.kind == "cut":
        return  # connection ends with no finish_reason and no [DONE]
    extra: dict[str, Any] = {}
    if message.get("refusal"):
        extra["refusal"] = message["refusal"]
    if message.get("tool_calls"):
        extra["tool_calls"] = [{"index": 0, **message["tool_calls"][0]}]
    last = {"choices": [{"index": 0, "delta": extra, "finish_reason": choice["finish_reason"]}]}
    yield f"data: {json.dumps({**head, **last})}\n\n".encode()
    yield f"data: {json.dumps({**head, 'choices': [], 'usage': full['usage']})}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def _stream_responses(step: Step, body: Mapping[str, Any]) -> AsyncIterator[bytes]:
    full = _openai_responses(step, body)
    created = {"type": "response.created", "response": {**full, "status": "in_progress", "output": []}}
    yield f"event: response.created\ndata: {json.dumps(created)}\n\n".encode()
    text = "".join(
        part.get("text", "") for item in full["output"] for part in item.get("content", []) if isinstance(part, dict)
    )
    for i in range(0, len(text), 8):
        delta = {"type": "response.output_text.delta", "delta": text[i : i + 8]}
        yield f"event: response.output_text.delta\ndata: {json.dumps(delta)}\n\n".encode()
        if step.stall_s:
            await asyncio.sleep(step.stall_s)
    if step.kind == "cut":
        return  # no final event
    final = "response.incomplete" if full["status"] == "incomplete" else "response.completed"
    yield f"event: {final}\ndata: {json.dumps({'type': final, 'response': full})}\n\n".encode()


async def _trickle(body: bytes, pause_s: float, pieces: int = 8) -> AsyncIterator[bytes]:
    size = max(1, -(-len(body) // pieces))
    for i in range(0, len(body), size):
        if i:
            await asyncio.sleep(pause_s)
        yield body[i : i + size]


#: What a content block holds in its content_block_start event, before its deltas.
_EMPTY_BLOCKS: dict[str, dict[str, Any]] = {
    "text": {"text": ""},
    "thinking": {"thinking": ""},
    "tool_use": {"input": {}},
}


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps({'type': event, **data})}\n\n".encode()


async def _stream_anthropic(step: Step, body: Mapping[str, Any]) -> AsyncIterator[bytes]:
    """Anthropic Messages events: message_start, each block's start/deltas/stop, message_delta, message_stop."""
    full = _anthropic(step, body)
    usage = full["usage"]
    start = {
        **full,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1},
    }
    yield _sse("message_start", {"message": start})
    for index, block in enumerate(full["content"]):
        kind = block["type"]
        empty = _EMPTY_BLOCKS[kind]
        yield _sse("content_block_start", {"index": index, "content_block": {**block, **empty}})
        if kind == "tool_use":
            text = "{bad json" if step.malformed else json.dumps(block["input"])
            field, delta_type = "partial_json", "input_json_delta"
        else:
            text, field, delta_type = block[kind], kind, f"{kind}_delta"
        for i in range(0, max(len(text), 1), 8):
            yield _sse("content_block_delta", {"index": index, "delta": {"type": delta_type, field: text[i : i + 8]}})
            if step.stall_s:
                await asyncio.sleep(step.stall_s)
            if step.kind == "overloaded":
                yield _sse("error", {"error": _OVERLOADED})
                return
        yield _sse("content_block_stop", {"index": index})
    if step.kind == "cut":
        return  # no message_delta: no stop_reason
    yield _sse("message_delta", {"delta": {"stop_reason": full["stop_reason"], "stop_sequence": None}, "usage": usage})
    yield _sse("message_stop", {})


_STREAMERS = {"chat/completions": _stream_chat, "responses": _stream_responses, "messages": _stream_anthropic}

_BUILDERS = {"chat/completions": _openai_chat, "responses": _openai_responses, "messages": _anthropic}


def create_app(scripts: Mapping[str, Sequence[Step]] | None = None) -> Starlette:
    """The Starlette app serving ``scripts`` (scenario name -> steps); ``default`` backs ``/v1``."""
    state = _Scripts(scripts or {})

    async def handle(request: Request) -> Response:
        scenario = request.path_params.get("scenario", "default")
        endpoint = request.path_params["endpoint"]
        builder = _BUILDERS.get(endpoint)
        if builder is None:
            return JSONResponse({"error": {"message": f"no endpoint {endpoint}"}}, status_code=404)
        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": {"message": "body is not JSON"}}, status_code=400)
        step = state.next(scenario, endpoint, body)
        streamer = _STREAMERS.get(endpoint)
        if body.get("stream") and streamer is not None and step.kind not in ("rate_limit", "server_error"):
            return StreamingResponse(streamer(step, body), media_type="text/event-stream")
        if step.stall_s:
            await asyncio.sleep(step.stall_s)
        answer = _error(step) or JSONResponse(builder(step, body))
        if step.trickle_s:
            return StreamingResponse(
                _trickle(bytes(answer.body), step.trickle_s), status_code=answer.status_code, headers=answer.headers
            )
        return answer

    async def log(request: Request) -> Response:
        return JSONResponse(state.log)

    return Starlette(
        routes=[
            Route("/_log", log, methods=["GET"]),
            Route("/v1/{endpoint:path}", handle, methods=["POST"]),
            Route("/{scenario}/v1/{endpoint:path}", handle, methods=["POST"]),
        ]
    )


@contextmanager
def serve_in_thread(app: Starlette, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` with uvicorn on an ephemeral port in a thread; yields the base URL; stops on exit."""
    config = uvicorn.Config(app, host=host, port=0, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="fault-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("fault server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server in the foreground with one ``default`` script."""
    parser = argparse.ArgumentParser(description="fault-injecting OpenAI/Anthropic-compatible server")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--script", default='[{"kind": "ok"}]', help="JSON list of steps for the default scenario")
    args = parser.parse_args(argv)
    steps = [Step.from_dict(raw) for raw in json.loads(args.script)]
    uvicorn.run(create_app({"default": steps}), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
