"""Property-based tests: budgets hold, side effects happen once, the fleet budget caps amplification."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_fakes import FAULT_KINDS, FakeClock, Fault, ScriptedTransport
from tenacity.wait import wait_none

from sre_agent.policy import (
    BudgetLimits,
    ChatRequest,
    PolicyEngine,
    PolicyResult,
    Pricing,
    RetryBudget,
    Target,
    wait_full_jitter,
)

faults = st.builds(
    Fault,
    kind=st.sampled_from(FAULT_KINDS),
    latency_s=st.floats(0.0, 20.0),
    retry_after_s=st.one_of(st.none(), st.floats(0.0, 40.0)),
)

limits = st.builds(
    BudgetLimits,
    max_attempts=st.integers(1, 7),
    max_tokens=st.one_of(st.none(), st.integers(0, 3000)),
    max_usd=st.one_of(st.none(), st.floats(0.0, 0.02)),
    deadline_s=st.one_of(st.none(), st.floats(0.5, 90.0)),
)

PRICING = Pricing(input_per_mtok=3.0, output_per_mtok=15.0)


def _engine(clock: FakeClock, budget: BudgetLimits, targets: int, **options: Any) -> PolicyEngine:
    return PolicyEngine(
        [Target(f"http://fake/{i}/v1", f"model-{i}", pricing=PRICING) for i in range(targets)],
        budget,
        clock=clock,
        sleep=clock.sleep,
        wait=wait_full_jitter(0.5, 8.0),
        attempt_timeout_s=30.0,
        **options,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(faults, min_size=1, max_size=12),
    budget=limits,
    targets=st.integers(1, 3),
    cap=st.integers(1, 2000),
    effort=st.sampled_from([None, "high", "low"]),
)
def test_no_failure_sequence_exceeds_any_budget(
    script: list[Fault], budget: BudgetLimits, targets: int, cap: int, effort: str | None
) -> None:
    clock = FakeClock()
    transport = ScriptedTransport(script, clock)
    engine = _engine(clock, budget, targets, tools={"page": lambda args: {"ok": True}})
    request = ChatRequest(
        ({"role": "user", "content": "why is p99 up?"},), max_output_tokens=cap, reasoning_effort=effort
    )
    with httpx.Client(transport=transport) as client:
        result = engine.run(client, request)
    assert len(result.attempts) <= budget.max_attempts
    assert len(transport.requests) == len(result.attempts)
    if budget.max_tokens is not None:
        assert result.tokens <= budget.max_tokens
    if budget.max_usd is not None:
        assert result.cost_usd <= budget.max_usd + 1e-12
    if budget.deadline_s is not None:
        assert result.elapsed_s <= budget.deadline_s + 1e-9
    # An exhausted attempt is never followed by the identical request to the same model.
    for before, after in zip(result.attempts, result.attempts[1:], strict=False):
        if before.outcome.cls.value == "exhausted" and before.model == after.model:
            i = before.number - 1
            sent_before, sent_after = transport.requests[i], transport.requests[i + 1]
            assert (sent_before.get("max_completion_tokens"), sent_before.get("reasoning_effort")) != (
                sent_after.get("max_completion_tokens"),
                sent_after.get("reasoning_effort"),
            )
    # A refusal is never retried on the same model.
    for before, after in zip(result.attempts, result.attempts[1:], strict=False):
        if before.outcome.cls.value == "refused":
            assert after.model != before.model


@settings(max_examples=100, deadline=None)
@given(
    script=st.lists(
        st.builds(Fault, kind=st.sampled_from(["tool_call", "server_error", "timeout", "bad_tool_call", "ok"])),
        min_size=1,
        max_size=10,
    ),
    tool_fails=st.booleans(),
)
def test_a_side_effecting_tool_never_runs_twice(script: list[Fault], tool_fails: bool) -> None:
    clock = FakeClock()
    transport = ScriptedTransport(script, clock)
    executions: Counter[str] = Counter()

    def page(args: dict[str, Any]) -> dict[str, Any]:
        executions[args["ticket"]] += 1
        if tool_fails:
            raise RuntimeError("pager timed out after sending")
        return {"paged": True}

    engine = _engine(clock, BudgetLimits(max_attempts=10, deadline_s=600.0), 2, tools={"page": page})
    with httpx.Client(transport=transport) as client:
        engine.run(client, ChatRequest(({"role": "user", "content": "page on-call"},), request_id="req-1"))
    assert all(count <= 1 for count in executions.values())
    if any(f.kind == "tool_call" for f in script[: len(transport.requests)]):
        assert executions["INC-1"] == 1


@settings(max_examples=20, deadline=None)
@given(
    ratio=st.sampled_from([0.0, 0.1, 0.2, 0.5, 1.0]),
    min_per_s=st.sampled_from([0.0, 0.5, 1.0]),
    requests=st.integers(20, 100),
    max_attempts=st.integers(2, 8),
)
def test_fleet_budget_caps_amplification_in_a_full_outage(
    ratio: float, min_per_s: float, requests: int, max_attempts: int
) -> None:
    clock = FakeClock()
    ttl_s = 10.0
    fleet = RetryBudget(ratio=ratio, min_retries_per_s=min_per_s, ttl_s=ttl_s, clock=clock)
    transport = ScriptedTransport([Fault("server_error", latency_s=0.0)], clock)
    engine = PolicyEngine(
        [Target("http://fake/v1", "m")],
        BudgetLimits(max_attempts=max_attempts),
        fleet=fleet,
        clock=clock,
        sleep=clock.sleep,
        wait=wait_none(),
        attempt_timeout_s=30.0,
    )
    with httpx.Client(transport=transport) as client:
        for _ in range(requests):
            clock.now += 0.01  # all requests within one TTL window: the tightest case
            result = engine.run(client, ChatRequest(({"role": "user", "content": "x"},)))
            assert not result.usable
    attempts = len(transport.requests)
    assert attempts <= requests * (1 + ratio) + min_per_s * ttl_s + 1e-9
    assert fleet.withdrawals_total == attempts - requests
    # Without the fleet budget each request would have made max_attempts attempts.
    if ratio < 1.0 and max_attempts > 2:
        assert attempts < requests * max_attempts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(faults, min_size=1, max_size=8), budget=limits, targets=st.integers(1, 2))
def test_the_async_path_keeps_the_same_budgets(script: list[Fault], budget: BudgetLimits, targets: int) -> None:
    clock = FakeClock()
    transport = ScriptedTransport(script, clock)

    async def fake_sleep(seconds: float) -> None:
        clock.sleep(seconds)

    engine = _engine(clock, budget, targets, async_sleep=fake_sleep)

    async def go() -> PolicyResult:
        async with httpx.AsyncClient(transport=transport) as client:
            return await engine.arun(client, ChatRequest(({"role": "user", "content": "why?"},), max_output_tokens=800))

    result = asyncio.run(go())
    assert len(result.attempts) <= budget.max_attempts
    if budget.max_tokens is not None:
        assert result.tokens <= budget.max_tokens
    if budget.max_usd is not None:
        assert result.cost_usd <= budget.max_usd + 1e-12
    if budget.deadline_s is not None:
        assert result.elapsed_s <= budget.deadline_s + 1e-9
