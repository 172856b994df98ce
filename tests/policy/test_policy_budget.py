"""Budgets, the Finagle retry budget, the tool ledger and tenacity composition."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from policy_fakes import FakeClock
from tenacity import stop_after_attempt
from tenacity.stop import stop_any

from sre_agent.errors import PolicyError
from sre_agent.policy import (
    Budget,
    BudgetLimits,
    Pricing,
    RetryBudget,
    ToolLedger,
    stop_on_budget,
    stop_on_fleet_budget,
)
from sre_agent.policy.outcome import ToolCall


def test_reserve_shrinks_the_output_cap_to_what_tokens_and_dollars_allow() -> None:
    clock = FakeClock()
    budget = Budget(BudgetLimits(max_attempts=3, max_tokens=1000, max_usd=0.01, deadline_s=60), clock)
    pricing = Pricing(input_per_mtok=10.0, output_per_mtok=20.0)
    first = budget.reserve(100, 5000, pricing, attempt_timeout_s=None)
    assert first is not None
    # tokens: 1000 - 100 = 900; dollars: (0.01 - 100*10e-6) / 20e-6 = 450
    assert first.max_output_tokens == 450
    assert first.usd == pytest.approx(0.01)
    assert first.timeout_s == 60
    budget.charge(first, tokens=None, usd=None)  # unknown spend: the whole reservation
    assert budget.reserve(100, 5000, pricing, attempt_timeout_s=None) is None
    assert budget.exceeded() == []


def test_deadline_bounds_the_attempt_timeout_and_refuses_when_spent() -> None:
    clock = FakeClock()
    budget = Budget(BudgetLimits(max_attempts=5, deadline_s=10), clock)
    clock.now += 7
    reservation = budget.reserve(10, 10, None, attempt_timeout_s=30)
    assert reservation is not None
    assert reservation.timeout_s == pytest.approx(3)
    clock.now += 3
    assert budget.reserve(10, 10, None, attempt_timeout_s=30) is None
    assert budget.fits_time(0.0)
    assert not budget.fits_time(0.1)


def test_limits_are_validated() -> None:
    with pytest.raises(PolicyError):
        BudgetLimits(max_attempts=0)
    with pytest.raises(PolicyError):
        BudgetLimits(max_usd=-1)
    with pytest.raises(PolicyError):
        RetryBudget(ttl_s=0.5)


def test_retry_budget_deposits_expire_and_reserve_allows_min_rate() -> None:
    clock = FakeClock()
    fleet = RetryBudget(ratio=0.5, min_retries_per_s=0.0, ttl_s=10, clock=clock)
    assert not fleet.try_withdraw()
    for _ in range(4):
        fleet.deposit()
    assert fleet.try_withdraw()
    assert fleet.try_withdraw()
    assert not fleet.try_withdraw()
    clock.now += 11  # deposits and withdrawals expire together
    assert fleet.balance == 0.0
    assert not fleet.try_withdraw()
    reserve = RetryBudget(ratio=0.2, min_retries_per_s=1.0, ttl_s=5, clock=clock)
    assert sum(reserve.try_withdraw() for _ in range(20)) == 5  # 1/s over a 5 s window
    assert RetryBudget(ratio=0.0, clock=clock).try_withdraw() is False


def test_ledger_runs_a_side_effecting_call_once_by_id_or_by_content() -> None:
    ledger = ToolLedger()
    runs: list[dict[str, object]] = []
    first = ToolCall("call_1", "refund", {"order": 7, "amount": 10})
    again = ToolCall("call_9", "refund", {"amount": 10, "order": 7})  # new id, same arguments

    def refund(answer: str) -> Callable[[dict[str, object]], str]:
        def run(args: dict[str, object]) -> str:
            runs.append(args)
            return answer

        return run

    entry = ledger.execute("req", first, refund("refunded"))
    assert ledger.execute("req", again, refund("again")).result == "refunded"
    assert ledger.execute("other-request", again, refund("ok")).result == "ok"
    assert len(runs) == 2
    assert entry.executions == 1
    reads: list[int] = []
    for _ in range(3):
        ledger.execute("req", ToolCall("c", "lookup", {}), lambda a: reads.append(1), side_effecting=False)
    assert len(reads) == 3


def test_ledger_never_reruns_a_call_that_raised() -> None:
    ledger = ToolLedger()
    calls = 0

    def flaky(args: dict[str, object]) -> None:
        nonlocal calls
        calls += 1
        raise TimeoutError("sent, then timed out")

    call = ToolCall("c1", "send_email", {"to": "oncall"})
    assert ledger.execute("r", call, flaky).error == "TimeoutError: sent, then timed out"
    assert ledger.execute("r", call, flaky).error is not None
    assert calls == 1
    assert ledger.lookup("r", call) is not None


def test_policy_stops_compose_with_tenacity_stops() -> None:
    combined = stop_on_budget() | stop_on_fleet_budget() | stop_after_attempt(3)
    assert isinstance(combined, stop_any)


def test_hedge_delay_follows_the_latency_p95_once_twenty_attempts_were_seen() -> None:
    from sre_agent.policy import PolicyEngine, Target

    adaptive = PolicyEngine([Target("http://x/v1", "m")], hedge_after_s=None)
    assert adaptive._hedge_delay("m") is None  # no history: no hedging
    for latency in range(1, 21):
        adaptive.latency.add("m", float(latency))
    assert adaptive._hedge_delay("m") == 20.0  # p95 of 1..20 s (nearest rank)
    assert PolicyEngine([Target("http://x/v1", "m")], hedge_after_s=0.0)._hedge_delay("m") is None
    assert PolicyEngine([Target("http://x/v1", "m")], hedge_after_s=1.5)._hedge_delay("m") == 1.5


def test_exhausted_lowers_the_effort_when_the_budget_cannot_pay_for_a_higher_cap() -> None:
    import httpx
    from policy_fakes import Fault, ScriptedTransport

    from sre_agent.policy import ChatRequest, PolicyEngine, Target

    clock = FakeClock()
    transport = ScriptedTransport([Fault("truncate"), Fault("truncate"), Fault("ok")], clock)
    engine = PolicyEngine(
        [Target("http://fake/v1", "m")], BudgetLimits(max_attempts=5, max_tokens=1500), clock=clock, sleep=clock.sleep
    )
    with httpx.Client(transport=transport) as client:
        result = engine.run(client, ChatRequest(({"role": "user", "content": "x"},), 1000, reasoning_effort="high"))
    sent = [(r["max_completion_tokens"], r.get("reasoning_effort")) for r in transport.requests]
    assert sent[0] == (1000, "high")
    assert sent[1][1] == "medium"  # cap could not be raised: ~480 tokens were left
    assert len(sent) == 2  # exhausted twice: recovered once, then stopped
    assert not result.usable
    assert result.tokens <= 1500
