"""Compute allocation on live model calls: a :class:`~sre_agent.policy.allocate.SampleSource` over engines.

Each *arm* is a :class:`~sre_agent.policy.client.PolicyEngine` with the request to
send (e.g. a cheap model at low effort, a strong model at high effort). Every draw is
one logical request under the engine's bounded retries, with its deadline cut to the
allocation's remaining time, so the allocation deadline also bounds retries. The
verifier is a plain function of the answer text (a schema check, unit tests, the
Game-of-24 checker); it is free unless ``verifier_cost_usd`` says otherwise.

Draws run one after another (a sync gateway); spend and time are what the engines
report and what the clock shows. A dollar budget for the whole allocation (verifier
included) caps every draw's own dollar limit at what is left, so the engine's retries
stay inside it; a draw is refused once nothing is left, and a verification that no
longer fits counts as a rejection. Policies fitted offline run here unchanged
(:meth:`LiveSource.run`), and features known before any call feed a feature router.

With a tracer, :meth:`LiveSource.run` wraps the allocation in a ``policy.allocate``
span; each draw is a ``policy.allocate.draw`` span (parent of the engine's
``policy.request`` span) and each verification a ``policy.allocate.verify`` span.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import httpx
from opentelemetry import trace

from sre_agent.policy.allocate import Allocation, Allocator, Draw
from sre_agent.policy.client import PolicyEngine, PolicyResult
from sre_agent.policy.recovery import ChatRequest

__all__ = ["LiveSource"]


class LiveSource:
    """A sample source whose arms are live engines (see the module docstring).

    Args:
        client: the injected httpx client every engine uses.
        arms: arm name -> (engine, request).
        verifier: answer text -> bool, or None for no verifier.
        deadline_s: seconds for the whole allocation, or None.
        verifier_cost_usd: dollars charged per verification.
        budget_usd: dollars for the whole allocation, verifications included, or None.
        features: what is known about the task before any call (for a feature router).
        tracer: OTel tracer for the allocation's spans (default: the global ``sre_agent.policy`` one).
        clock: monotonic seconds (injectable).
    """

    def __init__(
        self,
        client: httpx.Client,
        arms: Mapping[str, tuple[PolicyEngine, ChatRequest]],
        *,
        verifier: Callable[[str], bool] | None = None,
        deadline_s: float | None = None,
        verifier_cost_usd: float = 0.0,
        budget_usd: float | None = None,
        features: Mapping[str, float] | None = None,
        tracer: trace.Tracer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.arms = dict(arms)
        self.verifier = verifier
        self.deadline_s = deadline_s
        self.verifier_cost_usd = verifier_cost_usd
        self.budget_usd = budget_usd
        self._features = dict(features or {})
        self.tracer = tracer or trace.get_tracer("sre_agent.policy")
        self.clock = clock
        self.started_s = clock()
        self.spend_usd = 0.0
        self.verifier_usd = 0.0
        self.results: dict[int, PolicyResult] = {}

    def features(self) -> dict[str, float]:
        """The task's features (known before any call)."""
        return self._features

    def remaining_usd(self) -> float | None:
        """Dollars left in the allocation budget, or None without one."""
        return None if self.budget_usd is None else max(self.budget_usd - self.spend_usd, 0.0)

    def run(self, policy: Allocator) -> Allocation:
        """Run ``policy`` on this task inside a ``policy.allocate`` span; the span records the outcome."""
        with self.tracer.start_as_current_span("policy.allocate") as span:
            span.set_attribute("sre_agent.policy.allocator", policy.name)
            if self.deadline_s is not None:
                span.set_attribute("sre_agent.policy.deadline_s", self.deadline_s)
            if self.budget_usd is not None:
                span.set_attribute("sre_agent.policy.budget_usd", self.budget_usd)
            allocation = policy.run(self)
            span.set_attribute("sre_agent.policy.verified", allocation.verified)
            span.set_attribute("sre_agent.policy.flagged", allocation.flagged)
            span.set_attribute("sre_agent.policy.reason", allocation.reason)
            span.set_attribute("sre_agent.policy.draws", len(allocation.draws))
            span.set_attribute("sre_agent.policy.cost_usd", self.spend_usd)
            span.set_attribute("sre_agent.policy.verifier_cost_usd", self.verifier_usd)
            span.set_attribute("sre_agent.policy.elapsed_s", self.elapsed_s)
            if allocation.draw is not None:
                span.set_attribute("sre_agent.policy.arm", allocation.draw.arm)
            return allocation

    @property
    def elapsed_s(self) -> float:
        """Seconds since the allocation started."""
        return self.clock() - self.started_s

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline, or None."""
        return None if self.deadline_s is None else max(self.deadline_s - self.elapsed_s, 0.0)

    def expected_latency_s(self, arm: str) -> float:
        """The arm's recent p90 attempt latency (its target's prior before any call)."""
        engine, _ = self.arms[arm]
        target = engine.targets[0]
        return engine.latency.quantile(target.model, 0.9, target.expected_latency_s)

    def draw(self, arm: str, n: int = 1) -> list[Draw]:
        """``n`` logical requests on ``arm``, one after another; stops early when time or dollars run out."""
        engine, request = self.arms[arm]
        draws: list[Draw] = []
        for _ in range(n):
            remaining = self.remaining_s()
            left_usd = self.remaining_usd()
            if (remaining is not None and remaining <= 0) or (left_usd is not None and left_usd <= 0):
                break
            limits = replace(
                engine.limits,
                deadline_s=_tighter(engine.limits.deadline_s, remaining),
                max_usd=_tighter(engine.limits.max_usd, left_usd),
            )
            with self.tracer.start_as_current_span("policy.allocate.draw") as span:
                span.set_attribute("sre_agent.policy.arm", arm)
                result = engine.run(self.client, request, limits)
                span.set_attribute("sre_agent.policy.cost_usd", result.cost_usd)
                span.set_attribute("sre_agent.policy.usable", result.usable)
            self.spend_usd += result.cost_usd
            if not result.attempts:
                break  # the engine's budget refused even one attempt: nothing was drawn
            key = len(self.results) + 1
            self.results[key] = result
            text = result.outcome.text if result.usable and result.outcome is not None else ""
            draws.append(Draw(key, arm, text.strip(), result.cost_usd, result.elapsed_s))
        return draws

    def verify(self, draws: Sequence[Draw]) -> list[bool]:
        """The verifier's verdicts ([] without a verifier); an empty answer never passes.

        Verification is charged like a draw; when its cost no longer fits the dollar budget
        nothing is verified and every draw counts as rejected.
        """
        if self.verifier is None:
            return []
        cost = self.verifier_cost_usd * len(draws)
        left_usd = self.remaining_usd()
        with self.tracer.start_as_current_span("policy.allocate.verify") as span:
            span.set_attribute("sre_agent.policy.arms", [d.arm for d in draws])
            if left_usd is not None and cost > left_usd + 1e-12:
                span.set_attribute("sre_agent.policy.refused", True)
                return [False] * len(draws)
            self.spend_usd += cost
            self.verifier_usd += cost
            verdicts = [bool(d.answer) and self.verifier(d.answer) for d in draws]
            span.set_attribute("sre_agent.policy.verdicts", verdicts)
            span.set_attribute("sre_agent.policy.cost_usd", cost)
            return verdicts


def _tighter(limit: float | None, left: float | None) -> float | None:
    """The smaller of two optional limits (None: unlimited)."""
    if limit is None:
        return left
    return limit if left is None else min(limit, left)
