"""Decision overhead of the policy engine per attempt, against a bare tenacity loop in the same run.

Per attempt the engine reserves budget (input-token bound, output cap, dollars,
timeout), builds the request body, classifies the response (status, headers,
parsed JSON body), charges the budget, and lets its tenacity strategies decide
(retry: per-class recovery; wait: Retry-After or jitter; stop: budget, deadline
and the fleet retry budget). No network and no span export: a canned 503 is
answered three times, then a success, so each logical request makes 4 attempts.

The baseline is a bare ``tenacity.Retrying`` loop (stop after 4, exponential
jitter wait, retry on a None result) whose attempt function returns a canned value.

Run: ``python tests/benchmarks/policy.py``; the last line is
``policy: overhead_us=X tenacity_us=Y ratio=X/Y`` (microseconds per attempt).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from opentelemetry.trace import NoOpTracer
from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential_jitter

from sre_agent.policy import (
    BudgetLimits,
    ChatRequest,
    Outcome,
    PolicyEngine,
    Pricing,
    RecoveryConfig,
    RetryBudget,
    Target,
    classify,
)
from sre_agent.policy.strategies import AttemptState

ATTEMPTS = 4
REQUESTS = 2000
REPEATS = 7

FAILURE = (503, {"content-type": "application/json"}, {"error": {"type": "server_error", "message": "overloaded"}})
SUCCESS = (
    200,
    {"content-type": "application/json"},
    {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "24"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 412,
            "completion_tokens": 900,
            "completion_tokens_details": {"reasoning_tokens": 880},
            "prompt_tokens_details": {"cached_tokens": 256},
        },
    },
)
MESSAGES = (
    {"role": "system", "content": "You are a careful arithmetic assistant."},
    {"role": "user", "content": "Use 4 6 8 4 and + - * / to make 24. Show the expression."},
)


def _noop_sleep(seconds: float) -> None:
    """Backoff is decided but not slept: the benchmark measures decisions only."""


def policy_per_attempt_s() -> float:
    """Seconds per attempt of the engine's decision path (prepare, classify, charge, strategies)."""
    target = Target("http://127.0.0.1:9/v1", "o-mini", pricing=Pricing(1.1, 4.4))
    engine = PolicyEngine(
        [target],
        BudgetLimits(max_attempts=ATTEMPTS, max_tokens=200_000, max_usd=1.0, deadline_s=120.0),
        fleet=RetryBudget(ratio=1000.0, min_retries_per_s=1e6),
        recovery=RecoveryConfig(max_same_target_failures=ATTEMPTS),
        sleep=_noop_sleep,
        tracer=NoOpTracer(),
    )
    retrying = Retrying(stop=engine._stop, wait=engine._wait, retry=engine._retry, sleep=_noop_sleep)
    request = ChatRequest(MESSAGES, max_output_tokens=4096, reasoning_effort="high", request_id="bench")

    def attempt(state: AttemptState) -> Outcome:
        prepared = engine._prepare(state)
        assert prepared is not None
        status, headers, body = SUCCESS if state.budget.attempts == ATTEMPTS else FAILURE
        outcome = classify(status, headers, body, provider_format=target.provider_format, pricing=target.pricing)
        state.budget.charge(prepared.reservation, outcome.usage.total_tokens, outcome.cost_usd)
        outcome = engine._after_answer(state, outcome)
        state.last = outcome
        return outcome

    started = time.perf_counter()
    for _ in range(REQUESTS):
        state = engine.new_state(request)
        engine.fleet.deposit()  # type: ignore[union-attr]
        outcome = retrying(attempt, state)
        assert outcome.usable
        assert state.budget.attempts == ATTEMPTS
    return (time.perf_counter() - started) / (REQUESTS * ATTEMPTS)


def tenacity_per_attempt_s() -> float:
    """Seconds per attempt of a bare tenacity loop with a comparable stop/wait/retry."""
    retrying = Retrying(
        stop=stop_after_attempt(ATTEMPTS),
        wait=wait_exponential_jitter(multiplier=0.5, max=8.0),
        retry=retry_if_result(lambda result: result is None),
        sleep=_noop_sleep,
    )
    counter = {"n": 0}

    def attempt() -> Any:
        counter["n"] += 1
        return "24" if counter["n"] % ATTEMPTS == 0 else None

    started = time.perf_counter()
    for _ in range(REQUESTS):
        assert retrying(attempt) == "24"
    return (time.perf_counter() - started) / (REQUESTS * ATTEMPTS)


def calibration_us() -> float:
    """Microseconds for ``sum(range(100))``: about 0.7 us on an idle modern core; scales the figures."""
    import timeit

    return min(timeit.repeat("sum(range(100))", number=20_000, repeat=5)) / 20_000 * 1e6


def main() -> None:
    policy_per_attempt_s()  # warm-up (imports, caches)
    tenacity_per_attempt_s()
    # Interleaved so that a change in machine load hits both sides alike.
    policy, bare = [], []
    for _ in range(REPEATS):
        policy.append(policy_per_attempt_s())
        bare.append(tenacity_per_attempt_s())
    overhead_us = statistics.median(policy) * 1e6
    tenacity_us = statistics.median(bare) * 1e6
    print(f"attempts measured: {REQUESTS * ATTEMPTS} x {REPEATS} repeats each; medians")
    print(f"machine calibration: sum(range(100)) = {calibration_us():.2f} us (idle modern core: ~0.7 us)")
    print(f"engine decision path per attempt: {overhead_us:.1f} us (includes the tenacity loop it runs in)")
    extra_us = overhead_us - tenacity_us
    print(f"bare tenacity loop per attempt:   {tenacity_us:.1f} us; extra over tenacity {extra_us:.1f} us")
    print(f"policy: overhead_us={overhead_us:.1f} tenacity_us={tenacity_us:.1f} ratio={overhead_us / tenacity_us:.2f}")


if __name__ == "__main__":
    main()
