"""Why a reasoning-model request yielded (or did not yield) a usable answer.

:func:`classify` turns one HTTP exchange (status, headers, parsed JSON body)
into an :class:`Outcome`: a class from :class:`OutcomeClass`, the token
usage (input, output, reasoning, cached) and its dollar cost. Every provider
answers HTTP 200 when tokens were spent without a usable answer, so the body
decides; the tables below map each provider format's finish fields onto the
classes (CONTRACTS section 6 and docs/reference/providers-and-retries.md 2.5).

Unknown shapes are classified conservatively: an unrecognised finish value or
a 200 body with no recognisable answer is ``invalid_output`` (never
``success``), an unknown 4xx is ``client_error`` (never retried), an unknown
5xx is ``server_error``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, NamedTuple

from sre_agent.policy.hints import failure_hints, parse_retry_after

__all__ = [
    "FORMATS",
    "Outcome",
    "OutcomeClass",
    "Pricing",
    "ToolCall",
    "Usage",
    "classify",
    "classify_exception",
    "parse_retry_after",
]


class OutcomeClass(StrEnum):
    """What one attempt produced. ``client_error`` covers 4xx that no retry can fix (auth, bad request)."""

    SUCCESS = "success"
    EXHAUSTED = "exhausted"
    REFUSED = "refused"
    TOOL_ERROR = "tool_error"
    CONTEXT_OVERFLOW = "context_overflow"
    RATE_LIMITED = "rate_limited"
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    INVALID_OUTPUT = "invalid_output"
    CLIENT_ERROR = "client_error"


# Module-level names for the members: reading a member off the Enum class costs about four
# global lookups, and classification tests several per answer.
_S = OutcomeClass.SUCCESS
_EXH = OutcomeClass.EXHAUSTED
_REF = OutcomeClass.REFUSED
_TOOL = OutcomeClass.TOOL_ERROR
_CTX = OutcomeClass.CONTEXT_OVERFLOW
_SRV = OutcomeClass.SERVER_ERROR
_INV = OutcomeClass.INVALID_OUTPUT


# Usage and Outcome are frozen dataclasses built on every classified answer. Their __init__
# sets the slots through the slot descriptors instead of the generated frozen __init__'s
# object.__setattr__ per field (about 40% cheaper); eq, hash, repr, replace() and
# FrozenInstanceError are the dataclass's own. tests/policy/test_policy_fastpath.py checks
# that each hand-written signature matches the declared fields and defaults.


@dataclass(frozen=True, slots=True, init=False)
class Usage:
    """Tokens billed for one attempt. ``reasoning_tokens`` and ``cached_tokens`` are subsets of output/input."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0

    def __init__(
        self, input_tokens: int = 0, output_tokens: int = 0, reasoning_tokens: int = 0, cached_tokens: int = 0
    ) -> None:
        _u_input(self, input_tokens)
        _u_output(self, output_tokens)
        _u_reasoning(self, reasoning_tokens)
        _u_cached(self, cached_tokens)

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens (reasoning is already inside output)."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Pricing:
    """Dollar prices per million tokens. Cached input is billed at ``cached_input_per_mtok`` when given."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    cached_input_per_mtok: float | None = None

    def cost_usd(self, usage: Usage) -> float:
        """Dollar cost of ``usage`` (reasoning tokens are billed as output)."""
        cached_price = self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok
        uncached = usage.input_tokens - usage.cached_tokens
        if uncached < 0:  # max(uncached, 0) without the builtin call  # noqa: PLR1730
            uncached = 0
        return (
            uncached * self.input_per_mtok
            + usage.cached_tokens * cached_price
            + usage.output_tokens * self.output_per_mtok
        ) / 1e6

    def worst_case_usd(self, input_tokens: int, max_output_tokens: int) -> float:
        """Upper bound on an attempt's cost: no cache hits and every allowed output token billed."""
        return (input_tokens * self.input_per_mtok + max_output_tokens * self.output_per_mtok) / 1e6


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model asked for. ``arguments`` is None when the model's JSON did not parse."""

    call_id: str
    name: str
    arguments: dict[str, Any] | None


_u_input, _u_output, _u_reasoning, _u_cached = (
    Usage.__dict__[name].__set__ for name in ("input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens")
)
_NO_USAGE = Usage()


@dataclass(frozen=True, slots=True, init=False)
class Outcome:
    """The classified result of one attempt.

    Attributes:
        cls: the outcome class.
        usage: tokens billed (zeros when the provider reported none, e.g. on 429).
        cost_usd: dollars for ``usage`` under the engine's pricing (0.0 without pricing).
        status_code: HTTP status, or None when no response arrived (timeout, connection error).
        finish_reason: the provider's raw finish/stop value, or None.
        retry_after_s: the server's requested wait in seconds, or None when it gave no hint.
        should_retry: the ``x-should-retry`` header as a bool, or None when absent.
        reasoning_only: True when the output cap was hit with no visible text (all tokens spent reasoning).
        text: the visible answer text ('' when none).
        tool_calls: tool calls the model asked for, in order.
        detail: a short human-readable reason.
    """

    cls: OutcomeClass
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    status_code: int | None = None
    finish_reason: str | None = None
    retry_after_s: float | None = None
    should_retry: bool | None = None
    reasoning_only: bool = False
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    detail: str = ""

    def __init__(  # noqa: PLR0917 - the positional order of the dataclass fields, as before
        self,
        cls: OutcomeClass,
        usage: Usage = _NO_USAGE,  # immutable, so one shared zero Usage() is as good as a fresh one
        cost_usd: float = 0.0,
        status_code: int | None = None,
        finish_reason: str | None = None,
        retry_after_s: float | None = None,
        should_retry: bool | None = None,
        reasoning_only: bool = False,
        text: str = "",
        tool_calls: tuple[ToolCall, ...] = (),
        detail: str = "",
    ) -> None:
        _o_cls(self, cls)
        _o_usage(self, usage)
        _o_cost_usd(self, cost_usd)
        _o_status_code(self, status_code)
        _o_finish_reason(self, finish_reason)
        _o_retry_after_s(self, retry_after_s)
        _o_should_retry(self, should_retry)
        _o_reasoning_only(self, reasoning_only)
        _o_text(self, text)
        _o_tool_calls(self, tool_calls)
        _o_detail(self, detail)

    @property
    def usable(self) -> bool:
        """True when the attempt produced an answer the caller can use."""
        return self.cls is _S


(
    _o_cls,
    _o_usage,
    _o_cost_usd,
    _o_status_code,
    _o_finish_reason,
    _o_retry_after_s,
    _o_should_retry,
    _o_reasoning_only,
    _o_text,
    _o_tool_calls,
    _o_detail,
) = (Outcome.__dict__[f.name].__set__ for f in fields(Outcome))  # in field order: see the signature test

# ---------------------------------------------------------------------------------------------
# body helpers


def _dig(body: Any, path: tuple[str | int, ...]) -> Any:
    # The hot path of classification: plain indexing, with any shape mismatch meaning "absent".
    node = body
    try:
        for key in path:
            node = node[key]
    except (KeyError, IndexError, TypeError):
        return None
    return node


def _items(node: Any) -> list[Any]:
    """``node`` when it is a JSON array, else empty: a malformed body is unusable, never a crash."""
    return node if isinstance(node, list) else []


def _int(body: Any, paths: tuple[tuple[str | int, ...], ...]) -> int:
    # Runs four times per classified body: _dig inlined, and an exact int (the usual JSON
    # token count) returned before the general number check.
    for path in paths:
        node = body
        try:
            for key in path:
                node = node[key]
        except (KeyError, IndexError, TypeError):
            continue
        if type(node) is int:
            return node
        if isinstance(node, int | float) and not isinstance(node, bool):
            return int(node)
    return 0


def _parse_args(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


class _Parsed(NamedTuple):
    # A NamedTuple, not a frozen dataclass: built once per 2xx body and about 3x cheaper to create.
    finish: str | None
    text: str
    refusal: bool
    tool_calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class FormatSpec:
    """How one provider format reports finish, text and usage.

    ``finish_classes`` maps raw finish values to classes; the empty-text rule and the
    refusal/tool-call checks are applied on top by :func:`classify`.
    """

    name: str
    parse: Callable[[Any], _Parsed]
    finish_classes: Mapping[str, OutcomeClass]
    input_paths: tuple[tuple[str | int, ...], ...]
    output_paths: tuple[tuple[str | int, ...], ...]
    reasoning_paths: tuple[tuple[str | int, ...], ...]
    cached_paths: tuple[tuple[str | int, ...], ...]
    # Gemini counts thoughts outside candidatesTokenCount; the others include reasoning in output.
    reasoning_in_output: bool = True

    def usage(self, body: Any) -> Usage:
        """Token usage read from ``body`` (missing fields count as 0); output always includes reasoning."""
        reasoning = _int(body, self.reasoning_paths)
        output = _int(body, self.output_paths)
        return Usage(
            _int(body, self.input_paths),
            output if self.reasoning_in_output else output + reasoning,
            reasoning,
            _int(body, self.cached_paths),
        )


def _parse_openai_chat(body: Any) -> _Parsed:
    choice = _dig(body, ("choices", 0))
    message = _dig(choice, ("message",)) or {}
    if isinstance(message, dict):
        raw_calls = _items(message.get("tool_calls"))
        content = message.get("content")
        refusal = message.get("refusal")
    else:
        raw_calls, content, refusal = [], None, None
    calls = (
        tuple(
            ToolCall(
                call_id=str(call.get("id", "")),
                name=str(_dig(call, ("function", "name")) or ""),
                arguments=_parse_args(_dig(call, ("function", "arguments"))),
            )
            for call in raw_calls
            if isinstance(call, dict)
        )
        if raw_calls
        else ()  # the usual answer: no generator to build and drain
    )
    finish = _dig(choice, ("finish_reason",))
    return _Parsed(
        finish if isinstance(finish, str) else None, content if isinstance(content, str) else "", bool(refusal), calls
    )


def _parse_openai_responses(body: Any) -> _Parsed:
    status = _dig(body, ("status",))
    reason = _dig(body, ("incomplete_details", "reason"))
    error_code = _dig(body, ("error", "code"))
    finish = status if isinstance(status, str) else None
    if status == "incomplete" and isinstance(reason, str):
        finish = f"incomplete:{reason}"
    elif status == "failed" and isinstance(error_code, str):
        finish = f"failed:{error_code}"
    texts: list[str] = []
    refusal = False
    calls: list[ToolCall] = []
    for item in _items(_dig(body, ("output",))):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            calls.append(
                ToolCall(
                    call_id=str(item.get("call_id", item.get("id", ""))),
                    name=str(item.get("name", "")),
                    arguments=_parse_args(item.get("arguments")),
                )
            )
        for part in _items(item.get("content")):
            if not isinstance(part, dict):
                continue
            if part.get("type") == "refusal":
                refusal = True
            elif part.get("type") == "output_text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return _Parsed(finish=finish, text="".join(texts), refusal=refusal, tool_calls=tuple(calls))


def _parse_anthropic(body: Any) -> _Parsed:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in _items(_dig(body, ("content",))):
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(
                ToolCall(
                    call_id=str(block.get("id", "")),
                    name=str(block.get("name", "")),
                    arguments=_parse_args(block.get("input")),
                )
            )
    stop = _dig(body, ("stop_reason",))
    return _Parsed(
        finish=stop if isinstance(stop, str) else None, text="".join(texts), refusal=False, tool_calls=tuple(calls)
    )


def _parse_gemini(body: Any) -> _Parsed:
    blocked = _dig(body, ("promptFeedback", "blockReason"))
    if isinstance(blocked, str):
        return _Parsed(finish=f"BLOCKED:{blocked}", text="", refusal=True, tool_calls=())
    parts = _items(_dig(body, ("candidates", 0, "content", "parts")))
    texts = [
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
    ]
    calls = tuple(
        ToolCall(
            call_id=str(i),
            name=str(_dig(p, ("functionCall", "name")) or ""),
            arguments=_parse_args(p["functionCall"].get("args")),
        )
        for i, p in enumerate(parts)
        if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
    )
    finish = _dig(body, ("candidates", 0, "finishReason"))
    return _Parsed(
        finish=finish if isinstance(finish, str) else None, text="".join(texts), refusal=False, tool_calls=calls
    )


#: Finish-value tables per provider format (reference section 2.5).
FORMATS: dict[str, FormatSpec] = {
    "openai-chat": FormatSpec(
        name="openai-chat",
        parse=_parse_openai_chat,
        finish_classes={"stop": _S, "tool_calls": _S, "function_call": _S, "length": _EXH, "content_filter": _REF},
        input_paths=(("usage", "prompt_tokens"),),
        output_paths=(("usage", "completion_tokens"),),
        reasoning_paths=(("usage", "completion_tokens_details", "reasoning_tokens"),),
        cached_paths=(("usage", "prompt_tokens_details", "cached_tokens"),),
    ),
    "openai-responses": FormatSpec(
        name="openai-responses",
        parse=_parse_openai_responses,
        finish_classes={
            "completed": _S,
            "incomplete:max_output_tokens": _EXH,
            "incomplete:content_filter": _REF,
            "failed:server_error": _SRV,
            "failed:rate_limit_exceeded": OutcomeClass.RATE_LIMITED,
            "failed:vector_store_timeout": OutcomeClass.TIMEOUT,
            "failed:bio_policy": _REF,
            "failed:image_content_policy_violation": _REF,
            "failed:invalid_prompt": OutcomeClass.CLIENT_ERROR,
            # Background mode: the work has not finished within this call.
            "queued": OutcomeClass.TIMEOUT,
            "in_progress": OutcomeClass.TIMEOUT,
        },
        input_paths=(("usage", "input_tokens"),),
        output_paths=(("usage", "output_tokens"),),
        reasoning_paths=(("usage", "output_tokens_details", "reasoning_tokens"),),
        cached_paths=(("usage", "input_tokens_details", "cached_tokens"),),
    ),
    "anthropic": FormatSpec(
        name="anthropic",
        parse=_parse_anthropic,
        finish_classes={
            "end_turn": _S,
            "stop_sequence": _S,
            "tool_use": _S,
            # pause_turn means "send it back to continue": usable as a turn, not an error.
            "pause_turn": _S,
            "max_tokens": _EXH,
            "model_context_window_exceeded": _EXH,
            "refusal": _REF,
        },
        input_paths=(("usage", "input_tokens"),),
        output_paths=(("usage", "output_tokens"),),
        reasoning_paths=(("usage", "output_tokens_details", "thinking_tokens"),),
        cached_paths=(("usage", "cache_read_input_tokens"),),
    ),
    "gemini": FormatSpec(
        name="gemini",
        parse=_parse_gemini,
        finish_classes={
            "STOP": _S,
            "MAX_TOKENS": _EXH,
            **dict.fromkeys(("SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"), _REF),
            **dict.fromkeys(("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS"), _TOOL),
        },
        input_paths=(("usageMetadata", "promptTokenCount"), ("usage_metadata", "prompt_token_count")),
        output_paths=(("usageMetadata", "candidatesTokenCount"), ("usage_metadata", "candidates_token_count")),
        reasoning_paths=(("usageMetadata", "thoughtsTokenCount"), ("usage_metadata", "thoughts_token_count")),
        cached_paths=(("usageMetadata", "cachedContentTokenCount"), ("usage_metadata", "cached_content_token_count")),
        reasoning_in_output=False,
    ),
}

# Substrings of error codes/messages that mean "the prompt does not fit" (OpenAI, Anthropic, vLLM).
_CONTEXT_MARKERS = ("context_length_exceeded", "maximum context length", "prompt is too long", "context window")
_REFUSAL_MARKERS = ("content_policy", "content_filter", "safety")


def _error_text(body: Any) -> str:
    parts = [_dig(body, ("error", key)) for key in ("code", "type", "message")]
    parts.append(_dig(body, ("message",)))
    return " ".join(p for p in parts if isinstance(p, str)).lower()


#: The HTTP status an error object inside a 200 body (a mid-stream error) stands for, by the
#: words of its code/type/message, first match: Anthropic streams send ``overloaded_error`` (a 529
#: outside a stream), ``api_error`` (500) and ``rate_limit_error`` (429) this way.
_IN_BODY_STATUSES: tuple[tuple[str, int], ...] = (
    ("rate_limit", 429),
    ("overloaded", 529),
    ("server", 500),
    ("api_error", 500),
    ("timeout", 408),
)


def _in_body_status(text: str) -> int:
    return next((status for marker, status in _IN_BODY_STATUSES if marker in text), 400)


def _classify_status(status: int, body: Any) -> tuple[OutcomeClass, str]:
    if status == 429:
        return OutcomeClass.RATE_LIMITED, "HTTP 429"
    if status == 408:
        return OutcomeClass.TIMEOUT, "HTTP 408"
    if status >= 500:
        # Providers report an oversized prompt as 400/413, never 5xx: no need to read the body.
        return OutcomeClass.SERVER_ERROR, f"HTTP {status}"
    text = _error_text(body)
    if status == 413 or any(m in text for m in _CONTEXT_MARKERS):
        return OutcomeClass.CONTEXT_OVERFLOW, f"HTTP {status}: prompt does not fit"
    if any(m in text for m in _REFUSAL_MARKERS):
        return OutcomeClass.REFUSED, f"HTTP {status}: content policy"
    return OutcomeClass.CLIENT_ERROR, f"HTTP {status}"


#: (class, detail) of the statuses whose class does not depend on the body (408, 429, 5xx),
#: precomputed by _classify_status itself: a retried 429/503 costs one dict lookup.
_BODY_FREE_STATUSES = {status: _classify_status(status, None) for status in (408, 429, *range(500, 600))}


def classify(
    status_code: int,
    headers: Mapping[str, str],
    body: Any,
    *,
    provider_format: str = "openai-chat",
    pricing: Pricing | None = None,
    now_s: float | None = None,
) -> Outcome:
    """Classify one HTTP response.

    Args:
        status_code: the HTTP status.
        headers: response headers (any case).
        body: the parsed JSON body (a dict), or None / a string when it was not JSON.
        provider_format: a key of :data:`FORMATS`; an unknown format is an error.
        pricing: dollar prices; None means cost 0.0.
        now_s: Unix seconds for HTTP-date ``Retry-After`` values (default: wall clock).
    """
    spec = FORMATS[provider_format]
    has_usage = isinstance(body, dict) and ("usage" in body or "usageMetadata" in body or "usage_metadata" in body)
    usage = spec.usage(body) if has_usage else _NO_USAGE
    if status_code >= 400 or status_code < 200:
        # Server hints only matter on failures; skipping them keeps the success path short.
        retry_after, should_retry = failure_hints(headers, now_s) if status_code >= 400 else (None, None)
        cls, detail = _BODY_FREE_STATUSES.get(status_code) or _classify_status(status_code, body)
        if usage is _NO_USAGE:
            key = (status_code, cls, detail, retry_after, should_retry)
            shared = _FAILURES.get(key)
            if shared is not None and shared[0] is pricing:
                return shared[1]
            return _shared_failure(key, pricing)
        cost = pricing.cost_usd(usage) if pricing is not None else 0.0
        return Outcome(
            cls, usage, cost, status_code, retry_after_s=retry_after, should_retry=should_retry, detail=detail
        )
    cost = pricing.cost_usd(usage) if pricing is not None else 0.0
    if not isinstance(body, dict):
        return Outcome(OutcomeClass.INVALID_OUTPUT, usage, cost, status_code, detail="body is not a JSON object")
    if isinstance(body.get("error"), dict) and not body.get("choices") and not body.get("output"):
        cls, detail = _classify_status(_in_body_status(_error_text(body)), body)
        return Outcome(cls, usage, cost, status_code, detail=f"error object in 200 body ({detail})")
    finish, text, refusal, tool_calls = spec.parse(body)
    cls = spec.finish_classes.get(finish or "", _INV)
    detail = f"finish={finish}"
    reasoning_only = False
    if refusal:
        cls, detail = _REF, "refusal in output"
    elif cls is _EXH:
        reasoning_only = not text.strip() and usage.reasoning_tokens >= usage.output_tokens > 0
        detail = "output cap hit, all tokens spent on reasoning" if reasoning_only else "output cap hit"
    elif cls is _S:
        if tool_calls and any(call.arguments is None for call in tool_calls):
            cls, detail = _TOOL, "malformed tool-call arguments"
        elif not tool_calls and not text.strip():
            cls, detail = _INV, "finished with no text and no tool call"
    elif finish is None or finish not in spec.finish_classes:
        detail = f"unknown finish value {finish!r}"
    # Positional: the generated keyword __init__ of a frozen dataclass costs measurably more per call.
    # Fields: cls, usage, cost_usd, status_code, finish_reason, retry_after_s, should_retry,
    # reasoning_only, text, tool_calls, detail (no server hints below 400).
    return Outcome(cls, usage, cost, status_code, finish, None, None, reasoning_only, text, tool_calls, detail)


#: Failure outcomes without reported usage, keyed by ``(status_code, cls, detail, retry_after_s,
#: should_retry)``, each with the pricing its cost came from. Outcome and Pricing are immutable,
#: so retries that get the same 429/5xx under the same pricing share one instance instead of
#: building eleven frozen fields (and the cost of zero usage) each time. Cleared when full:
#: Retry-After values make the key space open-ended.
_FailureKey = tuple[int, OutcomeClass, str, float | None, bool | None]
_FAILURES: dict[_FailureKey, tuple[Pricing | None, Outcome]] = {}
_FAILURES_MAX = 1024


def _shared_failure(key: _FailureKey, pricing: Pricing | None) -> Outcome:
    """Build, remember and return the outcome for ``key`` with no usage reported, priced with ``pricing``.

    classify looks the table up itself (one call less per retried failure) and calls this on a miss.
    """
    if len(_FAILURES) >= _FAILURES_MAX:
        _FAILURES.clear()
    status_code, cls, detail, retry_after, should_retry = key
    cost = pricing.cost_usd(_NO_USAGE) if pricing is not None else 0.0
    outcome = Outcome(
        cls, _NO_USAGE, cost, status_code, retry_after_s=retry_after, should_retry=should_retry, detail=detail
    )
    _FAILURES[key] = (pricing, outcome)
    return outcome


def classify_exception(exc: BaseException) -> Outcome:
    """Classify a transport failure (no response): timeouts are ``timeout``, anything else ``server_error``."""
    name = type(exc).__name__
    if "Timeout" in name:
        return Outcome(OutcomeClass.TIMEOUT, detail=name)
    return Outcome(OutcomeClass.SERVER_ERROR, detail=f"transport error: {name}")
