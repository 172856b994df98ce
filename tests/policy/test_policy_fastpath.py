"""The per-attempt fast path decides exactly what the straightforward code would (issue 6).

Each shortcut taken for speed (call templates, shared failure outcomes, one-pass header
hints, the fused stop strategy, the inlined reserve) is checked against the plain
definition it replaces, on generated inputs.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import pickle
import random
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fakes import FakeClock
from tenacity import RetryCallState, Retrying

from sre_agent.policy import (
    Budget,
    BudgetLimits,
    ChatRequest,
    Outcome,
    OutcomeClass,
    Pricing,
    RetryBudget,
    Target,
    Usage,
    classify,
    stop_on_budget,
    stop_on_fleet_budget,
    wait_full_jitter,
)
from sre_agent.policy import outcome as outcome_module
from sre_agent.policy.budget import Reservation
from sre_agent.policy.hints import failure_hints, parse_retry_after, should_retry_header
from sre_agent.policy.recovery import RecoveryPlanner
from sre_agent.policy.strategies import AttemptState, stop_on_budget_or_fleet
from sre_agent.policy.wire import build_call, call_template, input_tokens_bound

MESSAGES = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Why is p99 up? (ünïcode)"},
)
TOOLS = ({"type": "function", "function": {"name": "page", "parameters": {"type": "object"}}},)


SYSTEM, USER = MESSAGES
# The bodies each provider documents, written out: (format, effort, tools, stream) -> (url suffix, body
# with the cap as "CAP"). Key order matters: it is the order of the JSON sent.
CASES: list[tuple[str, str | None, bool, bool, str, dict[str, Any]]] = [
    ("openai-chat", None, False, False, "/chat/completions",
     {"model": "m", "messages": [SYSTEM, USER], "max_completion_tokens": "CAP"}),
    ("openai-chat", "high", True, True, "/chat/completions",
     {"model": "m", "messages": [SYSTEM, USER], "max_completion_tokens": "CAP", "reasoning_effort": "high",
      "tools": list(TOOLS), "stream": True, "stream_options": {"include_usage": True}}),
    ("openai-responses", None, False, False, "/responses",
     {"model": "m", "input": [SYSTEM, USER], "max_output_tokens": "CAP"}),
    ("openai-responses", "low", True, True, "/responses",
     {"model": "m", "input": [SYSTEM, USER], "max_output_tokens": "CAP", "reasoning": {"effort": "low"},
      "tools": list(TOOLS), "stream": True}),
    ("anthropic", None, False, False, "/messages",
     {"model": "m", "messages": [USER], "max_tokens": "CAP", "system": "Be brief."}),
    ("anthropic", "max", False, False, "/messages",
     {"model": "m", "messages": [USER], "max_tokens": "CAP", "system": "Be brief.",
      "output_config": {"effort": "max"}}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_call_template_sends_the_documented_body_for_every_cap(
    case: tuple[str, str | None, bool, bool, str, dict[str, Any]],
) -> None:
    fmt, effort, tools, stream, path, documented = case
    target = Target("http://h:1/v1/", "m", provider_format=fmt, headers=(("authorization", "Bearer t"),))
    request = ChatRequest(MESSAGES, 512, reasoning_effort=effort, tools=TOOLS if tools else None, stream=stream)
    template = call_template(target, request)
    for cap in (512, 100, 100, 512):
        call = template.call(cap)
        expected = {key: cap if value == "CAP" else value for key, value in documented.items()}
        # Same keys in the same order, so the JSON on the wire is byte-identical.
        assert json.dumps(call.body) == json.dumps(expected)
        assert call.url == "http://h:1/v1" + path
        assert call.headers["authorization"] == "Bearer t"
    assert json.dumps(build_call(target, request, 77).body) == json.dumps(
        {key: 77 if value == "CAP" else value for key, value in documented.items()}
    )


def test_a_same_cap_retry_reuses_the_call_and_a_new_cap_never_touches_the_old_one() -> None:
    template = call_template(Target("http://h/v1", "m"), ChatRequest(MESSAGES, 512))
    first = template.call(512)
    assert template.call(512) is first
    lowered = template.call(300)
    assert lowered is not first
    assert (first.body["max_completion_tokens"], lowered.body["max_completion_tokens"]) == (512, 300)
    assert template.body["max_completion_tokens"] == 0  # the template itself is never sent


def test_retries_of_one_failure_share_one_outcome_per_pricing() -> None:
    body = {"error": {"type": "server_error", "message": "overloaded"}}
    cheap, dear = Pricing(1.0, 2.0), Pricing(-1.0, -2.0)  # negative prices: the zero cost is -0.0
    first = classify(503, {"retry-after": "2"}, body, pricing=cheap)
    again = classify(503, {"Retry-After": "2"}, body, pricing=cheap)
    assert again is first
    assert (first.cls, first.status_code, first.retry_after_s, first.detail) == (
        OutcomeClass.SERVER_ERROR,
        503,
        2.0,
        "HTTP 503",
    )
    other = classify(503, {"retry-after": "2"}, body, pricing=dear)
    assert other is not first
    assert math.copysign(1.0, other.cost_usd) == -1.0  # priced by its own pricing, not the cached one
    assert classify(503, {"retry-after": "3"}, body, pricing=cheap).retry_after_s == 3.0
    assert classify(429, {"retry-after": "2"}, body, pricing=cheap).cls is OutcomeClass.RATE_LIMITED
    # A failure that reports usage is never shared: its cost depends on the usage.
    with_usage = {**body, "usage": {"prompt_tokens": 10, "completion_tokens": 0}}
    billed = classify(503, {}, with_usage, pricing=cheap)
    assert billed.usage.input_tokens == 10
    assert billed.cost_usd == pytest.approx(10e-6)


def test_the_shared_failure_table_stays_bounded() -> None:
    for millis in range(outcome_module._FAILURES_MAX + 50):
        classify(429, {"retry-after-ms": str(millis)}, None)
    assert len(outcome_module._FAILURES) <= outcome_module._FAILURES_MAX
    assert classify(429, {"retry-after-ms": "1500"}, None).retry_after_s == 1.5


HEADER_NAMES = ["Retry-After", "retry-after", "RETRY-AFTER-MS", "retry-after-ms", "x-ms-retry-after-ms"]
HEADER_NAMES += ["X-Should-Retry", "x-should-retry", "content-type"]
HEADER_VALUES = ["1", "0.25", "-3", "true", "false", " TRUE ", "soon", "Wed, 21 Oct 2015 07:28:30 GMT"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(HEADER_NAMES), st.sampled_from(HEADER_VALUES), max_size=5))
def test_one_pass_header_hints_match_the_two_separate_readers(headers: dict[str, str]) -> None:
    now = 1445412480.0
    expected = (parse_retry_after(headers, now), should_retry_header(headers))
    assert failure_hints(headers, now) == expected
    outcome = classify(503, headers, None, now_s=now)
    assert (outcome.retry_after_s, outcome.should_retry) == expected
    wire = httpx.Headers(list(headers.items()))
    assert failure_hints(wire, now) == (parse_retry_after(wire, now), should_retry_header(wire))


def _retry_state(state: AttemptState, upcoming_sleep: float) -> RetryCallState:
    retry_state = RetryCallState(Retrying(), fn=None, args=(state,), kwargs={})
    retry_state.upcoming_sleep = upcoming_sleep
    return retry_state


@settings(max_examples=300, deadline=None)
@given(
    attempts=st.integers(0, 5),
    tokens=st.integers(0, 3000),
    usd=st.floats(0.0, 0.03),
    elapsed=st.floats(0.0, 100.0),
    sleep=st.floats(0.0, 30.0),
    continuation=st.booleans(),
    fleet_ratio=st.sampled_from([None, 0.0, 0.5]),
    deposits=st.integers(0, 3),
)
def test_the_fused_stop_decides_and_withdraws_like_the_composed_one(
    *,
    attempts: int,
    tokens: int,
    usd: float,
    elapsed: float,
    sleep: float,
    continuation: bool,
    fleet_ratio: float | None,
    deposits: int,
) -> None:
    decisions = []
    for stop in (stop_on_budget() | stop_on_fleet_budget(), stop_on_budget_or_fleet()):
        clock = FakeClock()
        fleet = None if fleet_ratio is None else RetryBudget(fleet_ratio, min_retries_per_s=0.0, clock=clock)
        for _ in range(deposits if fleet is not None else 0):
            fleet.deposit()  # type: ignore[union-attr]
        budget = Budget(BudgetLimits(max_attempts=4, max_tokens=2000, max_usd=0.02, deadline_s=60.0), clock)
        budget.attempts, budget.tokens, budget.usd = attempts, tokens, usd
        clock.now += elapsed
        state = AttemptState(budget, fleet, RecoveryPlanner([Target("http://h/v1", "m")]), expected_latency_s=1.0)
        state.continuation = continuation
        decided = stop(_retry_state(state, sleep))
        withdrawn = None if fleet is None else (fleet.withdrawals_total, fleet.refusals_total)
        decisions.append((decided, withdrawn))
    assert decisions[0] == decisions[1]


def _reserve_reference(
    budget: Budget, bound: int, wanted: int, pricing: Pricing | None, timeout: float | None
) -> tuple[int, float, float | None] | None:
    """reserve() written with the public helpers, without the inlining."""
    limits = budget.limits
    remaining = budget.remaining_s()
    if budget.attempts >= limits.max_attempts or (remaining is not None and remaining <= 0.0):
        return None
    cap = wanted
    if limits.max_tokens is not None:
        cap = min(cap, limits.max_tokens - budget.tokens - bound)
    if limits.max_usd is not None and pricing is not None:
        left = limits.max_usd - budget.usd - bound * pricing.input_per_mtok / 1e6
        if pricing.output_per_mtok > 0:
            cap = min(cap, math.floor(left * 1e6 / pricing.output_per_mtok))
        elif left < 0:
            cap = -1
    if cap < 1:
        return None
    if remaining is not None:
        timeout = remaining if timeout is None else min(timeout, remaining)
    return cap, (pricing.worst_case_usd(bound, cap) if pricing is not None else 0.0), timeout


@settings(max_examples=400, deadline=None)
@given(
    limits=st.builds(
        BudgetLimits,
        max_attempts=st.integers(1, 4),
        max_tokens=st.one_of(st.none(), st.integers(0, 5000)),
        max_usd=st.one_of(st.none(), st.floats(0.0, 0.05)),
        deadline_s=st.one_of(st.none(), st.floats(0.0, 90.0)),
    ),
    spent=st.tuples(st.integers(0, 4), st.integers(0, 5000), st.floats(0.0, 0.05), st.floats(0.0, 100.0)),
    bound=st.integers(0, 3000),
    wanted=st.integers(1, 8000),
    # Real prices: 0 or at least a cent per million tokens (a subnormal price overflows either way).
    pricing=st.one_of(st.none(), st.builds(Pricing, st.floats(0.0, 30.0), st.just(0.0) | st.floats(0.01, 60.0))),
    timeout=st.one_of(st.none(), st.floats(0.1, 60.0)),
)
def test_reserve_matches_its_plain_definition(
    *,
    limits: BudgetLimits,
    spent: tuple[int, int, float, float],
    bound: int,
    wanted: int,
    pricing: Pricing | None,
    timeout: float | None,
) -> None:
    clock = FakeClock()
    budget = Budget(limits, clock)
    budget.attempts, budget.tokens, budget.usd, elapsed = spent
    clock.now += elapsed
    expected = _reserve_reference(budget, bound, wanted, pricing, timeout)
    reservation = budget.reserve(bound, wanted, pricing, timeout)
    if expected is None:
        assert reservation is None
        assert budget.attempts == spent[0]
    else:
        assert reservation == Reservation(bound, *expected)
        assert budget.attempts == spent[0] + 1


@pytest.mark.parametrize(
    ("cls", "args"),
    [
        (Reservation, (10, 20, 0.5, None)),
        (Usage, (100, 50, 40, 10)),
        (Outcome, (OutcomeClass.SERVER_ERROR, Usage(1, 2), 0.25, 503, None, 1.5, False, False, "", (), "HTTP 503")),
    ],
)
def test_hand_written_inits_keep_the_frozen_dataclass_contract(cls: type, args: tuple[Any, ...]) -> None:
    parameters = list(inspect.signature(cls).parameters.values())
    declared = dataclasses.fields(cls)
    assert [p.name for p in parameters] == [f.name for f in declared]
    for parameter, declared_field in zip(parameters, declared, strict=True):
        if declared_field.default_factory is not dataclasses.MISSING:
            assert parameter.default == declared_field.default_factory()
        else:
            assert parameter.default == (
                inspect.Parameter.empty if declared_field.default is dataclasses.MISSING else declared_field.default
            )
    instance = cls(*args)
    assert [getattr(instance, f.name) for f in declared] == list(args)
    assert instance == cls(**{f.name: value for f, value in zip(declared, args, strict=True)})
    assert hash(instance) == hash(cls(*args))
    assert pickle.loads(pickle.dumps(instance)) == instance
    first = declared[0].name
    assert dataclasses.replace(instance, **{first: args[0]}) == instance
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(instance, first, args[0])


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8])
def test_default_full_jitter_draws_what_random_uniform_would(attempt: int) -> None:
    retry_state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
    retry_state.attempt_number = attempt
    high = min(8.0, 0.5 * 2 ** (attempt - 1))
    random.seed(attempt)
    drawn = wait_full_jitter()(retry_state)
    random.seed(attempt)
    assert drawn == random.uniform(0.0, high)
    assert wait_full_jitter(uniform=lambda low, high: high)(retry_state) == high  # an injected source still wins


@settings(max_examples=200, deadline=None)
@given(deadline=st.one_of(st.none(), st.floats(0.0, 60.0)), elapsed=st.floats(0.0, 90.0), seconds=st.floats(0.0, 90.0))
def test_fits_time_matches_remaining_s(deadline: float | None, elapsed: float, seconds: float) -> None:
    clock = FakeClock()
    budget = Budget(BudgetLimits(deadline_s=deadline), clock)
    clock.now += elapsed
    remaining = budget.remaining_s()
    assert budget.fits_time(seconds) is (remaining is None or seconds <= remaining)


@settings(max_examples=200, deadline=None)
@given(contents=st.lists(st.text(max_size=30), min_size=1, max_size=4), with_tools=st.booleans())
def test_input_bound_is_the_utf8_size_of_the_json_as_documented(contents: list[str], with_tools: bool) -> None:
    messages = tuple({"role": "user", "content": text} for text in contents)
    request = ChatRequest(messages, tools=TOOLS if with_tools else None)
    size = len(json.dumps(messages, ensure_ascii=False).encode())
    if with_tools:
        size += len(json.dumps(TOOLS, ensure_ascii=False).encode())
    assert input_tokens_bound(request) == size + 16 + 8 * len(messages)
