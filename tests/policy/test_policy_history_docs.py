"""``PolicyResult.history`` lists the recovery decisions that attempts acted on, and only those;
``ChatRequest``'s docstring says which wire formats stream.

The engine runs against a scripted httpx transport on a fake clock (policy_fakes), so
no time passes; the planner, the stop strategy and the budget are the real ones.
"""

from __future__ import annotations

from dataclasses import replace

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_fakes import FakeClock, Fault, ScriptedTransport
from test_policy_properties import _engine

from sre_agent.policy import BudgetLimits, ChatRequest, PolicyResult, Target
from sre_agent.policy.wire import call_template

REQUEST = ChatRequest(({"role": "user", "content": "why is p99 up?"},), max_output_tokens=256)
# No tool calls: every decision the planner takes then leads to exactly one next attempt.
KINDS = ("ok", "rate_limit", "server_error", "truncate", "refusal", "context_overflow", "empty", "timeout")


def _run(script: list[Fault], limits: BudgetLimits, targets: int = 1) -> PolicyResult:
    clock = FakeClock()
    engine = _engine(clock, limits, targets)  # the engine the budget properties run
    with httpx.Client(transport=ScriptedTransport(script, clock)) as client:
        return engine.run(client, REQUEST)


def test_a_retry_the_budget_did_not_allow_is_not_recorded_as_a_retry() -> None:
    result = _run([Fault("timeout")], BudgetLimits(max_attempts=1))
    assert len(result.attempts) == 1
    assert result.history == ("give up: budget exhausted (retry timeout not attempted)",)


def test_retries_that_ran_are_recorded() -> None:
    result = _run([Fault("server_error"), Fault("timeout"), Fault("ok")], BudgetLimits(max_attempts=5))
    assert [a.outcome.cls.value for a in result.attempts] == ["server_error", "timeout", "success"]
    assert result.history == ("retry server_error", "retry timeout")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(
        st.builds(Fault, kind=st.sampled_from(KINDS), latency_s=st.floats(0.0, 20.0)), min_size=1, max_size=8
    ),
    max_attempts=st.integers(1, 6),
    deadline_s=st.one_of(st.none(), st.floats(1.0, 90.0)),
    targets=st.integers(1, 3),
)
def test_every_recorded_decision_started_an_attempt(
    script: list[Fault], max_attempts: int, deadline_s: float | None, targets: int
) -> None:
    result = _run(script, BudgetLimits(max_attempts=max_attempts, deadline_s=deadline_s), targets)
    acted_on = [note for note in result.history if not note.startswith("give up")]
    assert len(acted_on) == len(result.attempts) - 1
    assert sum(note.startswith("give up") for note in result.history) <= 1


def test_the_stream_docstring_says_what_the_wire_does() -> None:
    # The docstring once said streaming was "ignored for Anthropic" while the engine streamed it.
    doc = ChatRequest.__doc__ or ""
    assert "ignored for Anthropic" not in doc
    streamed = replace(REQUEST, stream=True)
    for fmt in ("openai-chat", "openai-responses", "anthropic"):
        call = call_template(Target("http://fake/v1", "m", provider_format=fmt), streamed).call(64)
        assert call.body["stream"] is True, fmt
        assert fmt.split("-")[0] in doc.lower()
