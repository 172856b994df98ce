"""End-to-end: the policy engine over real HTTP against the fault-injecting server on 127.0.0.1."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sre_agent.policy import BudgetLimits, ChatRequest, PolicyEngine, PolicyResult, Pricing, RetryBudget, Target
from sre_agent.replays.fault_server import Step

SCRIPTS = {
    "ratelimit": [Step("rate_limit", retry_after_s=0.25), Step("ok", text="(4 + 8) * (6 - 4) = 24")],
    "longwait": [Step("rate_limit", retry_after_s=120), Step("ok")],
    "longwait-alone": [Step("rate_limit", retry_after_s=120), Step("ok")],
    "flaky": [Step("server_error", status=503), Step("server_error", status=529), Step("ok")],
    "truncate": [Step("truncate"), Step("ok", reasoning_tokens=300)],
    "refuse": [Step("refusal"), Step("ok")],
    "fallback": [Step("ok", text="from the fallback")],
    "tools": [Step("tool_call"), Step("tool_call"), Step("ok", text="ticket filed")],
    "anthropic-tools": [Step("tool_call"), Step("tool_call"), Step("ok", text="ticket filed")],
    "stall": [Step("stall", stall_s=1.0), Step("ok")],
    "trickle": [Step("ok", trickle_s=0.25), Step("ok", text="whole")],
    "cut": [Step("cut", text="a long answer that is cut"), Step("ok")],
    "anthropic": [Step("truncate"), Step("ok", text="done")],
    "responses": [Step("refusal"), Step("ok")],
    "hedge-async": [Step("stall", stall_s=2.0), Step("ok", text="hedged")],
    "hedge-sync": [Step("stall", stall_s=2.0), Step("ok", text="hedged")],
    "overflow": [Step("context_overflow"), Step("ok")],
    "responses-stream": [Step("cut", text="cut short"), Step("truncate"), Step("ok", text="streamed 24")],
    "anthropic-stream": [
        Step("cut", text="cut short"),
        Step("overloaded", text="overloaded mid-way"),
        Step("truncate"),
        Step("ok", text="streamed 24", reasoning_tokens=40),
    ],
    "anthropic-tools-stream": [Step("tool_call"), Step("tool_call", malformed=True)],
}
MESSAGES = ({"role": "user", "content": "Use 4 6 8 4 to make 24."},)
PRICING = Pricing(input_per_mtok=1.0, output_per_mtok=4.0)


def _target(base_url: str, scenario: str, model: str = "o-mini", fmt: str = "openai-chat") -> Target:
    return Target(f"{base_url}/{scenario}/v1", model, provider_format=fmt, pricing=PRICING)


def _log(base_url: str, scenario: str) -> list[dict[str, Any]]:
    return [entry for entry in httpx.get(f"{base_url}/_log").json() if entry["scenario"] == scenario]


def _attempt_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]


def test_rate_limit_honours_retry_after_within_deadline_and_emits_spans(
    base_url: str, spans: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    exporter, provider = spans
    slept: list[float] = []
    engine = PolicyEngine(
        [_target(base_url, "ratelimit")],
        BudgetLimits(max_attempts=3, deadline_s=30),
        sleep=slept.append,
        tracer=provider.get_tracer("test"),
    )
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES))
    assert result.usable
    assert result.outcome is not None
    assert "24" in result.outcome.text
    assert slept == [0.25]
    attempts = _attempt_spans(exporter)
    assert [s.attributes["http.request.resend_count"] for s in attempts] == [0, 1]  # type: ignore[index]
    assert [s.attributes["sre_agent.policy.outcome"] for s in attempts] == ["rate_limited", "success"]  # type: ignore[index]
    assert attempts[0].attributes["error.type"] == "rate_limited"  # type: ignore[index]
    assert attempts[1].attributes["gen_ai.usage.output_tokens"] > 0  # type: ignore[index,operator]
    assert attempts[1].attributes["sre_agent.policy.cost_usd"] > 0  # type: ignore[index,operator]
    parents = {s.parent.span_id for s in attempts if s.parent is not None}
    request_span = next(s for s in exporter.get_finished_spans() if s.name == "policy.request")
    assert parents == {request_span.context.span_id}


def test_retry_after_beyond_the_deadline_falls_back_at_once_or_fails_fast(base_url: str) -> None:
    slept: list[float] = []
    limits = BudgetLimits(max_attempts=4, deadline_s=10)
    with httpx.Client() as client:
        engine = PolicyEngine(
            [_target(base_url, "longwait"), _target(base_url, "fallback", "big")], limits, sleep=slept.append
        )
        result = engine.run(client, ChatRequest(MESSAGES))
        assert result.usable
        assert result.attempts[-1].model == "big"
        alone = PolicyEngine([_target(base_url, "longwait-alone")], limits, sleep=slept.append)
        failed = alone.run(client, ChatRequest(MESSAGES))
    assert sum(slept) == 0  # never slept towards a deadline it could not meet
    assert not failed.usable
    assert len(failed.attempts) == 1
    assert failed.outcome is not None
    assert failed.outcome.retry_after_s == 120


def test_server_errors_retry_with_jittered_backoff(base_url: str) -> None:
    slept: list[float] = []
    engine = PolicyEngine([_target(base_url, "flaky")], BudgetLimits(max_attempts=5), sleep=slept.append)
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES))
    assert result.usable
    assert [a.outcome.cls.value for a in result.attempts] == ["server_error", "server_error", "success"]
    assert len(slept) == 2
    assert 0 <= slept[0] <= 0.5
    assert 0 <= slept[1] <= 1.0


def test_exhausted_reasoning_raises_the_cap_once_never_resends_unchanged(base_url: str) -> None:
    engine = PolicyEngine([_target(base_url, "truncate")], BudgetLimits(max_attempts=4), sleep=lambda s: None)
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES, max_output_tokens=256, reasoning_effort="high"))
    first = result.attempts[0].outcome
    assert first.cls.value == "exhausted"
    assert first.reasoning_only
    sent = [entry["body"]["max_completion_tokens"] for entry in _log(base_url, "truncate")]
    assert sent == [256, 512]
    assert result.usable


def test_refusal_goes_to_the_fallback_model_not_the_same_one(base_url: str) -> None:
    engine = PolicyEngine(
        [_target(base_url, "refuse", "strict"), _target(base_url, "fallback", "lenient")],
        BudgetLimits(max_attempts=4),
        sleep=lambda s: None,
    )
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES))
    assert [a.model for a in result.attempts] == ["strict", "lenient"]
    assert len(_log(base_url, "refuse")) == 1
    assert result.usable


def test_context_overflow_without_fallback_is_not_retried(base_url: str) -> None:
    engine = PolicyEngine([_target(base_url, "overflow")], BudgetLimits(max_attempts=4), sleep=lambda s: None)
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES))
    assert not result.usable
    assert len(result.attempts) == 1
    assert result.outcome is not None
    assert result.outcome.cls.value == "context_overflow"


def test_tool_calls_run_once_through_the_ledger(base_url: str) -> None:
    filed: list[dict[str, Any]] = []

    def create_ticket(args: dict[str, Any]) -> dict[str, str]:
        filed.append(args)
        return {"id": "T-1"}

    engine = PolicyEngine(
        [_target(base_url, "tools")],
        BudgetLimits(max_attempts=5),
        tools={"create_ticket": create_ticket},
        sleep=lambda s: None,
    )
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES, request_id="incident-7"))
    assert result.usable
    assert result.outcome is not None
    assert result.outcome.text == "ticket filed"
    assert filed == [{"title": "disk full"}]  # the model asked twice; the ledger answered the second time
    tool_messages = [m for m in result.messages if m["role"] == "tool"]
    assert len(tool_messages) == 2
    assert all('"T-1"' in m["content"] for m in tool_messages)


def test_anthropic_tool_turns_run_once_and_go_back_as_tool_result_blocks(base_url: str) -> None:
    filed: list[dict[str, Any]] = []

    def create_ticket(args: dict[str, Any]) -> dict[str, str]:
        filed.append(args)
        return {"id": "T-1"}

    tool = {"type": "function", "function": {"name": "create_ticket", "parameters": {"type": "object"}}}
    engine = PolicyEngine(
        [_target(base_url, "anthropic-tools", "claude", "anthropic")],
        BudgetLimits(max_attempts=5),
        tools={"create_ticket": create_ticket},
        sleep=lambda s: None,
    )
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES, tools=(tool,), request_id="incident-8"))
    assert result.outcome is not None
    assert result.outcome.text == "ticket filed"
    assert filed == [{"title": "disk full"}]
    sent = [entry["body"] for entry in _log(base_url, "anthropic-tools")]
    assert sent[0]["tools"] == [{"name": "create_ticket", "input_schema": {"type": "object"}}]
    # The second request carries the model's tool_use turn and our tool_result, in Anthropic's shape.
    assistant, results = sent[1]["messages"][-2:]
    assert assistant["role"] == "assistant"
    assert assistant["content"][-1] == {"type": "tool_use", "id": "toolu_1", "name": "create_ticket",
                                        "input": {"title": "disk full"}}  # fmt: skip
    assert results["role"] == "user"
    assert [(b["type"], b["tool_use_id"]) for b in results["content"]] == [("tool_result", "toolu_1")]
    assert '"T-1"' in results["content"][0]["content"]


def _engine(
    base_url: str,
    scenario: str,
    model: str = "o-mini",
    fmt: str = "openai-chat",
    *,
    attempts: int = 3,
    attempt_timeout_s: float | None = None,
) -> PolicyEngine:
    """One target on the fault server's ``scenario``; never sleeps between attempts."""
    return PolicyEngine(
        [_target(base_url, scenario, model, fmt)],
        BudgetLimits(max_attempts=attempts, deadline_s=20),
        attempt_timeout_s=attempt_timeout_s,
        sleep=lambda s: None,
    )


def test_streaming_stall_times_out_and_retries(base_url: str) -> None:
    with httpx.Client() as client:
        result = _engine(base_url, "stall", attempt_timeout_s=0.3).run(client, ChatRequest(MESSAGES, stream=True))
    assert [a.outcome.cls.value for a in result.attempts] == ["timeout", "success"]
    assert result.elapsed_s < 5


def test_a_trickled_answer_is_cut_at_the_attempt_timeout(base_url: str) -> None:
    # Eight pieces 0.25 s apart: each read is well inside the timeout, the whole answer is not.
    with httpx.Client() as client:
        result = _engine(base_url, "trickle", attempt_timeout_s=0.6).run(client, ChatRequest(MESSAGES))
    assert [a.outcome.cls.value for a in result.attempts] == ["timeout", "success"]
    assert result.outcome.text == "whole"
    # Cut within one read of the timeout, not after the 1.75 s the trickle takes.
    assert result.attempts[0].latency_s < 0.6 + 0.25 + 0.2


def test_a_cut_stream_is_never_a_success(base_url: str) -> None:
    engine = PolicyEngine([_target(base_url, "cut")], BudgetLimits(max_attempts=3), sleep=lambda s: None)
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES, stream=True))
    assert [a.outcome.cls.value for a in result.attempts] == ["invalid_output", "success"]


def test_anthropic_and_responses_formats(base_url: str) -> None:
    with httpx.Client() as client:
        anthropic = PolicyEngine(
            [_target(base_url, "anthropic", "claude", "anthropic")], BudgetLimits(max_attempts=3), sleep=lambda s: None
        ).run(client, ChatRequest(MESSAGES, max_output_tokens=1024))
        responses = PolicyEngine(
            [_target(base_url, "responses", "o", "openai-responses"), _target(base_url, "fallback", "fb")],
            BudgetLimits(max_attempts=3),
            sleep=lambda s: None,
        ).run(client, ChatRequest(MESSAGES))
    assert [a.outcome.cls.value for a in anthropic.attempts] == ["exhausted", "success"]
    assert [e["body"]["max_tokens"] for e in _log(base_url, "anthropic")] == [1024, 2048]
    assert [a.outcome.cls.value for a in responses.attempts] == ["refused", "success"]


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_hedge_after_a_stall_wins_and_the_loser_is_charged(
    mode: str, base_url: str, spans: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    exporter, provider = spans
    fleet = RetryBudget(ratio=0.2, min_retries_per_s=1.0)
    engine = PolicyEngine(
        [_target(base_url, f"hedge-{mode}")],
        BudgetLimits(max_attempts=3, deadline_s=20),
        fleet=fleet,
        hedge_after_s=0.2,
        tracer=provider.get_tracer("test"),
    )
    if mode == "sync":  # the attempts run on worker threads, the calling thread classifies
        with httpx.Client() as client:
            result = engine.run(client, ChatRequest(MESSAGES))
    else:

        async def run() -> PolicyResult:
            async with httpx.AsyncClient() as client:
                return await engine.arun(client, ChatRequest(MESSAGES))

        result = asyncio.run(run())
    assert result.usable
    assert result.outcome is not None
    assert result.outcome.text == "hedged"
    assert result.elapsed_s < 1.5  # did not wait for the 2 s stall
    assert fleet.withdrawals_total == 1
    hedges = [s for s in _attempt_spans(exporter) if s.attributes["sre_agent.policy.hedge"]]  # type: ignore[index]
    losers = [s for s in _attempt_spans(exporter) if s.attributes["sre_agent.policy.cancelled"]]  # type: ignore[index]
    assert len(hedges) == 1
    assert len(losers) == 1
    # The cancelled attempt is charged its worst case: more than the winner's own tokens.
    assert result.tokens > result.outcome.usage.total_tokens


def test_responses_streaming_cut_and_truncation(base_url: str) -> None:
    engine = _engine(base_url, "responses-stream", "o", "openai-responses", attempts=4)
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES, stream=True, max_output_tokens=300))
    assert [a.outcome.cls.value for a in result.attempts] == ["invalid_output", "exhausted", "success"]
    assert result.outcome is not None
    assert result.outcome.text == "streamed 24"
    assert [e["body"]["max_output_tokens"] for e in _log(base_url, "responses-stream")] == [300, 300, 600]


def test_anthropic_streams_fold_into_the_message_they_stand_for(base_url: str) -> None:
    engine = _engine(base_url, "anthropic-stream", "claude", "anthropic", attempts=5)
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(MESSAGES, stream=True, max_output_tokens=300))
    # Cut before message_delta; an overloaded_error event in a 200 stream; max_tokens; the answer.
    classes = [a.outcome.cls.value for a in result.attempts]
    assert classes == ["invalid_output", "server_error", "exhausted", "success"]
    assert result.outcome is not None
    assert result.outcome.text == "streamed 24"
    assert result.outcome.usage.reasoning_tokens == 40  # from the cumulative usage of message_delta
    assert result.outcome.usage.input_tokens > 0  # from message_start
    log = _log(base_url, "anthropic-stream")
    assert all(entry["body"]["stream"] is True for entry in log)
    assert [entry["body"]["max_tokens"] for entry in log] == [300, 300, 300, 600]


def test_anthropic_streamed_tool_input_is_parsed_and_a_broken_one_is_caught(base_url: str) -> None:
    engine = _engine(base_url, "anthropic-tools-stream", "claude", "anthropic", attempts=1)
    with httpx.Client() as client:
        good = engine.run(client, ChatRequest(MESSAGES, stream=True))
        broken = engine.run(client, ChatRequest(MESSAGES, stream=True))
    assert good.outcome is not None
    assert [(c.name, c.arguments) for c in good.outcome.tool_calls] == [("create_ticket", {"title": "disk full"})]
    assert broken.attempts[0].outcome.cls.value == "tool_error"
