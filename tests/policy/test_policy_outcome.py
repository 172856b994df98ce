"""Outcome classification: one data file of cases per provider format, plus header parsing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sre_agent.policy import OutcomeClass, Pricing, Usage, classify
from sre_agent.policy.outcome import classify_exception, parse_retry_after

CASES = json.loads((Path(__file__).parent / "fixtures" / "classify_cases.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_classification_table(case: dict[str, Any]) -> None:
    outcome = classify(case["status"], case.get("headers", {}), case["body"], provider_format=case["format"])
    assert outcome.cls is OutcomeClass(case["class"])
    assert outcome.usable is (case["class"] == "success")
    if "usage" in case:
        assert outcome.usage == Usage(*case["usage"])
    if "reasoning_only" in case:
        assert outcome.reasoning_only is case["reasoning_only"]
    if "retry_after_s" in case:
        assert outcome.retry_after_s == case["retry_after_s"]
    if "should_retry" in case:
        assert outcome.should_retry is case["should_retry"]


def test_cost_counts_reasoning_as_output_and_discounts_cache() -> None:
    pricing = Pricing(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
    usage = Usage(input_tokens=1_000_000, output_tokens=500_000, reasoning_tokens=400_000, cached_tokens=200_000)
    assert pricing.cost_usd(usage) == pytest.approx(0.8 * 2.0 + 0.2 * 0.5 + 0.5 * 8.0)
    body = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 10}}
    assert classify(200, {}, body, pricing=pricing).cost_usd == pytest.approx(10 * 2.0 / 1e6)


def test_retry_after_http_date_and_garbage() -> None:
    assert parse_retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT"}, now_s=1445412480.0) == 30.0
    assert parse_retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, now_s=1445412500.0) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"x-ms-retry-after-ms": "250"}) == 0.25


def test_transport_errors() -> None:
    assert classify_exception(httpx.ReadTimeout("slow")).cls is OutcomeClass.TIMEOUT
    assert classify_exception(httpx.ConnectError("refused")).cls is OutcomeClass.SERVER_ERROR


@pytest.mark.parametrize(
    ("provider_format", "body"),
    [
        ("anthropic", {"content": True, "stop_reason": "end_turn"}),
        ("anthropic", {"content": "text", "stop_reason": "end_turn"}),
        ("openai-responses", {"status": "completed", "output": 7}),
        ("openai-responses", {"status": "completed", "output": [{"type": "message", "content": True}]}),
        ("openai-chat", {"choices": [{"message": {"content": "x", "tool_calls": 3}, "finish_reason": "stop"}]}),
        ("gemini", {"candidates": [{"content": {"parts": True}, "finishReason": "STOP"}]}),
    ],
)
def test_wrongly_typed_arrays_classify_instead_of_raising(provider_format: str, body: dict[str, Any]) -> None:
    """A differential fuzz found ``{"content": true}`` raising TypeError for Anthropic bodies."""
    outcome = classify(200, {}, body, provider_format=provider_format)
    assert isinstance(outcome.cls, OutcomeClass)
    if provider_format in ("anthropic", "gemini"):
        assert not outcome.usable  # no text and no tool call could be read
