"""tenacity strategies that read the policy state: stop, wait and retry of one kind each.

They subclass tenacity's ``stop_base``, ``wait_base`` and ``retry_base`` so they
compose with tenacity's own strategies through ``|``, ``&`` and ``+``. The
engine calls ``Retrying(...)(attempt_fn, state)``, so every strategy finds the
:class:`AttemptState` at ``retry_state.args[0]`` (one state object passed to
every strategy, as in tenacity's ``RetryCallState``). Time is read from the
state's budget (an injected clock), never from ``time.monotonic`` directly.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tenacity import RetryCallState
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from sre_agent.policy.budget import Budget, RetryBudget
from sre_agent.policy.outcome import Outcome, OutcomeClass

__all__ = [
    "AttemptState",
    "Planner",
    "retry_if_recoverable",
    "stop_on_budget",
    "stop_on_budget_or_fleet",
    "stop_on_fleet_budget",
    "wait_full_jitter",
    "wait_server_hint",
]


class Planner(Protocol):
    """Decides the next request after an outcome (per-class recovery); False means give up."""

    def plan(self, state: AttemptState, outcome: Outcome) -> bool:  # pragma: no cover - protocol
        """Prepare ``state`` for the next attempt and return True, or return False to stop."""
        ...


@dataclass(slots=True)
class AttemptState:
    """Everything the strategies of one logical request share.

    Attributes:
        budget: the per-request budget (its clock is the engine's clock).
        fleet: the process-wide retry budget, or None for no fleet limit.
        planner: per-class recovery; sets ``next_*`` fields and ``continuation``.
        expected_latency_s: how long one more attempt is expected to take (seconds).
        continuation: True when the next call is a new turn (tool results), not a retry:
            it neither waits nor withdraws from the fleet budget.
        skip_wait: True when the next attempt goes to a fallback target and need not wait.
        last: the last outcome, or None before the first attempt.
        extra: free slots for the engine (request being built, target index...).
    """

    budget: Budget
    fleet: RetryBudget | None
    planner: Planner
    expected_latency_s: float = 0.0
    continuation: bool = False
    skip_wait: bool = False
    last: Outcome | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def _state(retry_state: RetryCallState) -> AttemptState:
    state = retry_state.args[0]
    assert isinstance(state, AttemptState)  # the engine always passes it first
    return state


class retry_if_recoverable(retry_base):
    """Retry when the planner has a *changed* next request for this outcome class."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        future = retry_state.outcome
        if future is None:
            return False
        # One lock round-trip instead of two (``failed`` then ``result``): a failed future raises here.
        try:
            outcome = future.result()
        except BaseException:  # an exception escaped the attempt: a bug, let tenacity surface it
            return False
        if not isinstance(outcome, Outcome):
            return False
        state = retry_state.args[0]  # _state() inlined: this runs on every attempt
        assert isinstance(state, AttemptState)
        state.last = outcome  # the wait strategy reads it here instead of locking the future again
        state.continuation = False
        state.skip_wait = False
        return state.planner.plan(state, outcome)


def _over_budget(state: AttemptState, upcoming_sleep: float) -> bool:
    budget = state.budget
    limits = budget.limits
    if budget.attempts >= limits.max_attempts:
        return True
    if not budget.fits_time(upcoming_sleep + state.expected_latency_s):
        return True
    if limits.max_tokens is not None and budget.tokens >= limits.max_tokens:
        return True
    return limits.max_usd is not None and budget.usd >= limits.max_usd


def _fleet_refuses(state: AttemptState) -> bool:
    if state.continuation or state.fleet is None:
        return False
    return not state.fleet.try_withdraw()


class stop_on_budget(stop_base):
    """Stop when the next attempt (after the upcoming sleep) cannot fit the per-request budget.

    Checks attempts, the deadline against ``upcoming_sleep + expected_latency_s``
    (so a Retry-After that does not fit ends the loop instead of sleeping past it) and
    whether any tokens or dollars are left.
    """

    def __call__(self, retry_state: RetryCallState) -> bool:
        return _over_budget(_state(retry_state), retry_state.upcoming_sleep)


class stop_on_fleet_budget(stop_base):
    """Stop when the process-wide retry budget refuses a withdrawal (new turns do not withdraw).

    Put it last in a ``|`` chain: ``stop_any`` short-circuits, so a withdrawal happens only
    when every other stop condition let the retry through.
    """

    def __call__(self, retry_state: RetryCallState) -> bool:
        return _fleet_refuses(_state(retry_state))


class stop_on_budget_or_fleet(stop_base):
    """``stop_on_budget() | stop_on_fleet_budget()`` in one call, the engine's default stop.

    Same decisions in the same order (the fleet is asked only when the per-request budget
    lets the retry through), without ``stop_any``'s generator and a second state lookup.
    """

    def __call__(self, retry_state: RetryCallState) -> bool:
        state = retry_state.args[0]  # _state() inlined: this runs on every attempt
        assert isinstance(state, AttemptState)
        if _over_budget(state, retry_state.upcoming_sleep):
            return True
        fleet = state.fleet  # _fleet_refuses() inlined: one Python frame less per retry
        return not (state.continuation or fleet is None or fleet.try_withdraw())


class wait_server_hint(wait_base):
    """Wait what the server asked (Retry-After) when it did, otherwise ``fallback``; 0 for new turns and fallbacks."""

    def __init__(self, fallback: wait_base) -> None:
        self.fallback = fallback

    def __call__(self, retry_state: RetryCallState) -> float:
        state = retry_state.args[0]  # _state() inlined: this runs on every attempt
        assert isinstance(state, AttemptState)
        if state.continuation or state.skip_wait:
            return 0.0
        outcome = state.last  # set by retry_if_recoverable, which tenacity always runs first
        if outcome is not None and outcome.retry_after_s is not None:
            return outcome.retry_after_s
        return float(self.fallback(retry_state))


class wait_full_jitter(wait_base):
    """AWS full jitter: U(0, min(cap, base * 2**(n-1))) seconds, with an injectable random source.

    tenacity's ``wait_random_exponential`` is the same formula on the global ``random``; this one
    takes ``uniform`` so property tests are reproducible.
    """

    def __init__(self, base_s: float = 0.5, cap_s: float = 8.0, uniform: Callable[[float, float], float] | None = None):
        self.base_s = base_s
        self.cap_s = cap_s
        self.uniform = uniform or random.uniform

    def __call__(self, retry_state: RetryCallState) -> float:
        high: float = self.base_s * 2 ** (retry_state.attempt_number - 1)
        if not high < self.cap_s:  # min(cap_s, high) without the builtin call
            high = self.cap_s
        if self.uniform is _UNIFORM:
            # random.uniform(0, high) is 0.0 + (high - 0.0) * random(), i.e. exactly high * random()
            # for high >= 0; the C-level random() skips a Python-level call on every retry.
            return high * _RANDOM()
        return self.uniform(0.0, high)


_UNIFORM = random.uniform
_RANDOM = random.random


#: Outcome classes that a same-request retry can fix (server side, transient).
TRANSIENT = frozenset({OutcomeClass.SERVER_ERROR, OutcomeClass.TIMEOUT, OutcomeClass.RATE_LIMITED})
