"""Per-class recovery: what the next attempt changes after each outcome class.

The rules (docs/reference/providers-and-retries.md 2.5):

- ``exhausted``: once, raise the output cap (if the budget can pay for more than the
  cap already tried) or else lower the reasoning effort; never resend unchanged.
- ``refused`` / ``context_overflow``: never the same model again; the next fallback
  target if one is configured.
- ``rate_limited``: honour Retry-After only when it fits the deadline (the stop strategy
  checks that); when it cannot fit, go to a fallback at once or fail fast.
- ``server_error`` / ``timeout``: same target with jittered backoff up to
  ``max_same_target_failures`` in a row, then a fallback.
- ``tool_error``: a repair turn (the ledger keeps side-effecting tools from running twice).
- ``invalid_output``: resample a bounded number of times.
- ``client_error``: give up.
A server's ``x-should-retry: false`` forbids a same-target retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sre_agent.policy.outcome import Outcome, OutcomeClass, Pricing
from sre_agent.policy.strategies import TRANSIENT, AttemptState

__all__ = ["EFFORT_LEVELS", "ChatRequest", "RecoveryConfig", "RecoveryPlanner", "Target"]

#: Reasoning effort levels from most to least compute (OpenAI/Anthropic vocabularies overlap here).
EFFORT_LEVELS: tuple[str, ...] = ("max", "xhigh", "high", "medium", "low", "minimal")


@dataclass(frozen=True, slots=True)
class Target:
    """One model endpoint.

    Attributes:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (OpenAI) or ``https://api.anthropic.com/v1``.
        model: the model name sent in the body.
        provider_format: a key of :data:`sre_agent.policy.outcome.FORMATS` (not ``gemini``: classify-only).
        pricing: dollar prices; None means attempts cost 0 (dollar limits then never bind).
        headers: extra request headers (auth, ``anthropic-version``...).
        max_output_tokens_limit: the model's own ceiling when raising the cap.
        expected_latency_s: prior for one attempt's latency before any has been observed.
    """

    base_url: str
    model: str
    provider_format: str = "openai-chat"
    pricing: Pricing | None = None
    headers: tuple[tuple[str, str], ...] = ()
    max_output_tokens_limit: int = 32_768
    expected_latency_s: float = 1.0


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A logical request. ``messages`` are OpenAI-style role/content dicts.

    Attributes:
        max_output_tokens: the output cap (reasoning included) of the first attempt.
        reasoning_effort: None leaves the provider default.
        tools: OpenAI-style function tool definitions, or None.
        request_id: scopes the tool ledger; None uses a fresh id per call.
        stream: ask for server-sent events (OpenAI Chat, OpenAI Responses and Anthropic Messages); the
            events are folded into the body they stand for and classified like it.
    """

    messages: tuple[dict[str, Any], ...]
    max_output_tokens: int = 1024
    reasoning_effort: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    request_id: str | None = None
    stream: bool = False


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    """Knobs of :class:`RecoveryPlanner`; defaults follow the reference's recommendations."""

    exhausted_cap_factor: float = 2.0
    max_same_target_failures: int = 3
    refusal_fallback: bool = True
    invalid_output_retries: int = 1
    tool_repairs: int = 2


@dataclass(slots=True)
class Plan:
    """Mutable per-request recovery state (kept in ``AttemptState.extra['plan']``)."""

    request: ChatRequest
    target_index: int = 0
    exhausted_recovered: bool = False
    same_target_failures: int = 0
    invalid_retries: int = 0
    tool_repairs: int = 0
    pending_tool_turn: bool = False
    budget_refused: bool = False
    history: list[str] = field(default_factory=list)
    # The planner decides before the stop strategy and the budget have had their say, so a
    # decision waits here until an attempt acts on it (``started``) or the loop ends (``finished``).
    pending: str | None = None

    def decide(self, note: str) -> None:
        """Record what the next attempt changes; it enters ``history`` when that attempt starts."""
        self.pending = note

    def started(self) -> None:
        """An attempt started: the decision that led to it is now history."""
        if self.pending is not None:
            self.history.append(self.pending)
            self.pending = None

    def finished(self) -> None:
        """The loop ended: a decision no attempt acted on is recorded as not taken."""
        if self.pending is not None:
            self.history.append(f"give up: budget exhausted ({self.pending} not attempted)")
            self.pending = None


_SUCCESS = OutcomeClass.SUCCESS  # a member read off the Enum class costs about four global lookups

#: History notes of same-target retries, built once (an enum's ``.value`` is a slow property).
_RETRY_NOTES = {cls: f"retry {cls.value}" for cls in TRANSIENT}


def _lower_effort(effort: str | None) -> str | None:
    if effort is None:
        return "low"  # the provider default is usually medium: ask for less thinking
    if effort not in EFFORT_LEVELS:
        return None
    index = EFFORT_LEVELS.index(effort)
    return EFFORT_LEVELS[index + 1] if index + 1 < len(EFFORT_LEVELS) else None


class RecoveryPlanner:
    """The :class:`~sre_agent.policy.strategies.Planner` implementing the rules above."""

    def __init__(self, targets: Sequence[Target], config: RecoveryConfig | None = None) -> None:
        self.targets = tuple(targets)
        self.config = config or RecoveryConfig()

    def plan(self, state: AttemptState, outcome: Outcome) -> bool:
        """Prepare the next attempt in ``state.extra['plan']``; False ends the loop."""
        plan: Plan = state.extra["plan"]
        if plan.budget_refused:
            return False
        cls = outcome.cls
        if cls is _SUCCESS:
            if plan.pending_tool_turn:
                state.continuation = True
                return True
            return False
        if cls in TRANSIENT:
            return self._transient(state, plan, outcome)
        if cls is OutcomeClass.EXHAUSTED:
            return self._exhausted(state, plan)
        if cls is OutcomeClass.REFUSED:
            return self.config.refusal_fallback and self._fallback(state, plan, "refused")
        if cls is OutcomeClass.CONTEXT_OVERFLOW:
            return self._fallback(state, plan, "context_overflow")
        if cls is OutcomeClass.TOOL_ERROR:
            if plan.tool_repairs >= self.config.tool_repairs:
                return False
            plan.tool_repairs += 1
            plan.decide("tool repair")
            return True  # the engine already appended the repair turn to the request
        if cls is OutcomeClass.INVALID_OUTPUT:
            if plan.invalid_retries >= self.config.invalid_output_retries:
                return self._fallback(state, plan, "invalid_output")
            plan.invalid_retries += 1
            plan.decide("resample")
            return True
        return False  # client_error and anything new: never guess

    def _transient(self, state: AttemptState, plan: Plan, outcome: Outcome) -> bool:
        if outcome.should_retry is False:
            return self._fallback(state, plan, "x-should-retry: false")
        wait = outcome.retry_after_s
        if wait is not None and not state.budget.fits_time(wait + state.expected_latency_s):
            # Waiting as asked would miss the deadline: another target now, or fail fast.
            return self._fallback(state, plan, f"retry-after {wait:.3g}s does not fit")
        plan.same_target_failures += 1
        if plan.same_target_failures >= self.config.max_same_target_failures:
            return self._fallback(state, plan, f"{plan.same_target_failures} failures in a row")
        plan.decide(_RETRY_NOTES[outcome.cls])
        return True

    def _exhausted(self, state: AttemptState, plan: Plan) -> bool:
        if plan.exhausted_recovered:
            return False
        plan.exhausted_recovered = True
        request = plan.request
        target = self.targets[plan.target_index]
        wanted = min(int(request.max_output_tokens * self.config.exhausted_cap_factor), target.max_output_tokens_limit)
        affordable = _affordable_output_tokens(state, target)
        if wanted > request.max_output_tokens and affordable > request.max_output_tokens:
            plan.request = replace(request, max_output_tokens=min(wanted, affordable))
            plan.decide(f"raise cap to {plan.request.max_output_tokens}")
            return True
        effort = _lower_effort(request.reasoning_effort)
        if effort is None:
            return False  # nothing left to change: never resend unchanged
        plan.request = replace(request, reasoning_effort=effort)
        plan.decide(f"lower effort to {effort}")
        return True

    def _fallback(self, state: AttemptState, plan: Plan, reason: str) -> bool:
        if plan.target_index + 1 >= len(self.targets):
            plan.history.append(f"give up: {reason}")
            return False
        plan.target_index += 1
        plan.same_target_failures = 0
        plan.exhausted_recovered = False
        state.skip_wait = True
        plan.decide(f"fallback to {self.targets[plan.target_index].model}: {reason}")
        return True


def _affordable_output_tokens(state: AttemptState, target: Target) -> int:
    """Output tokens the budget could still pay for, ignoring input (an optimistic bound)."""
    budget = state.budget
    limits = budget.limits
    affordable = 1 << 62
    if limits.max_tokens is not None:
        affordable = limits.max_tokens - budget.tokens
    pricing = target.pricing
    if limits.max_usd is not None and pricing is not None and pricing.output_per_mtok > 0:
        affordable = min(affordable, int((limits.max_usd - budget.usd) * 1e6 / pricing.output_per_mtok))
    return affordable
