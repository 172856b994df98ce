"""Compute allocation on live model calls: a :class:`~sre_agent.policy.allocate.SampleSource` over engines.

Each *arm* is a :class:`~sre_agent.policy.client.PolicyEngine` with the request to
send (e.g. a cheap model at low effort, a strong model at high effort). Every draw is
one logical request under the engine's bounded retries, with its deadline cut to the
allocation's remaining time, so the allocation deadline also bounds retries. The
verifier is a plain function of the answer text (a schema check, unit tests, the
Game-of-24 checker); it is free unless ``verifier_cost_usd`` says otherwise.

Draws run one after another (a sync gateway); spend and time are what the engines
report and what the clock shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import httpx

from sre_agent.policy.allocate import Draw
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.arms = dict(arms)
        self.verifier = verifier
        self.deadline_s = deadline_s
        self.verifier_cost_usd = verifier_cost_usd
        self.clock = clock
        self.started_s = clock()
        self.spend_usd = 0.0
        self.results: dict[int, PolicyResult] = {}

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
        """``n`` logical requests on ``arm``, one after another; stops early when time runs out."""
        engine, request = self.arms[arm]
        draws: list[Draw] = []
        for _ in range(n):
            remaining = self.remaining_s()
            if remaining is not None and remaining <= 0:
                break
            deadline = remaining
            if engine.limits.deadline_s is not None:
                deadline = engine.limits.deadline_s if deadline is None else min(deadline, engine.limits.deadline_s)
            result = engine.run(self.client, request, replace(engine.limits, deadline_s=deadline))
            self.spend_usd += result.cost_usd
            key = len(self.results) + 1
            self.results[key] = result
            text = result.outcome.text if result.usable and result.outcome is not None else ""
            draws.append(Draw(key, arm, text.strip(), result.cost_usd, result.elapsed_s))
        return draws

    def verify(self, draws: Sequence[Draw]) -> list[bool]:
        """The verifier's verdicts ([] without a verifier); an empty answer never passes."""
        if self.verifier is None:
            return []
        self.spend_usd += self.verifier_cost_usd * len(draws)
        return [bool(d.answer) and self.verifier(d.answer) for d in draws]
