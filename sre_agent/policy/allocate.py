"""Compute allocation under a deadline: single runs, best-of-n, adaptive sampling, cascades, a router.

An allocation strategy spends samples from a :class:`SampleSource` (live model
calls, or a replay of a task-outcome table) and returns an :class:`Allocation`.
Strategies never see whether a sample is correct: only its answer, cost,
latency and the verifier's verdict (which costs money and time).

Composition, in tenacity's spirit:

- ``a + b`` is a cascade: ``b`` runs only when ``a`` returned no verified answer.
- ``a | b`` is a deadline fallback: ``a`` when its expected latency fits the time
  left, otherwise ``b``.

Every strategy stops before a draw whose expected latency would pass the
deadline and then returns the best answer so far (majority answer), flagged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "AdaptiveSampling",
    "AgreementCascade",
    "Allocation",
    "Allocator",
    "BestOfN",
    "Cascade",
    "DeadlineFallback",
    "Draw",
    "GiveUp",
    "Router",
    "SampleSource",
    "SingleRun",
    "agreement",
]


@dataclass(frozen=True, slots=True)
class Draw:
    """One sample as a policy sees it: no correctness. ``answer`` '' means no parsable answer."""

    key: int
    arm: str
    answer: str
    cost_usd: float
    latency_s: float


class SampleSource(Protocol):
    """Where samples come from. Times are seconds since the task started; dollars include the verifier."""

    @property
    def elapsed_s(self) -> float:
        """Seconds spent so far."""
        ...

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline, or None without one."""
        ...

    def expected_latency_s(self, arm: str) -> float:
        """A conservative latency estimate for one draw of ``arm`` (from history)."""
        ...

    def draw(self, arm: str, n: int = 1) -> list[Draw]:
        """Up to ``n`` samples of ``arm`` drawn in parallel (fewer when the arm runs out)."""
        ...

    def verify(self, draws: Sequence[Draw]) -> list[bool]:
        """The verifier's verdicts on ``draws`` (run in parallel); [] when there is no verifier."""
        ...


@dataclass(frozen=True, slots=True)
class Allocation:
    """What a strategy returns: the chosen draw (None: nothing), whether the verifier passed it, and why."""

    draw: Draw | None
    verified: bool
    flagged: bool
    draws: tuple[Draw, ...] = ()
    reason: str = ""


def agreement(draws: Sequence[Draw]) -> float:
    """Share of draws giving the most common non-empty answer (0.0 when none answered)."""
    answers = [d.answer for d in draws if d.answer]
    if not answers:
        return 0.0
    return Counter(answers).most_common(1)[0][1] / len(draws)


def _best_so_far(draws: Sequence[Draw], reason: str) -> Allocation:
    """The majority non-empty answer among ``draws`` (earliest on ties), flagged as unverified."""
    answered = [d for d in draws if d.answer]
    if not answered:
        return Allocation(draws[0] if draws else None, False, True, tuple(draws), reason)
    counts = Counter(d.answer for d in answered)
    top = max(answered, key=lambda d: counts[d.answer])
    return Allocation(top, False, True, tuple(draws), reason)


def _fits(source: SampleSource, seconds: float) -> bool:
    remaining = source.remaining_s()
    return remaining is None or seconds <= remaining


class Allocator:
    """Base class: ``run(source) -> Allocation``; composes with ``+`` (cascade) and ``|`` (deadline fallback)."""

    name = "allocator"

    def run(self, source: SampleSource) -> Allocation:  # pragma: no cover - abstract
        """Spend samples from ``source`` and choose an answer."""
        raise NotImplementedError

    def expected_latency_s(self, source: SampleSource) -> float:
        """How long this strategy expects to take at most (seconds); used by ``|``."""
        return 0.0

    def __add__(self, other: Allocator) -> Cascade:
        left = self.stages if isinstance(self, Cascade) else (self,)
        right = other.stages if isinstance(other, Cascade) else (other,)
        return Cascade((*left, *right))

    def __or__(self, other: Allocator) -> DeadlineFallback:
        return DeadlineFallback(self, other)

    def __repr__(self) -> str:
        return self.name


@dataclass(repr=False)
class GiveUp(Allocator):
    """Spend nothing more; return nothing (a router's answer to "too hard for the budget")."""

    name: str = "give_up"

    def run(self, source: SampleSource) -> Allocation:
        return Allocation(None, False, True, (), "gave up")


@dataclass(repr=False)
class SingleRun(Allocator):
    """One sample of ``arm`` (one run at that arm's effort level); verified only when ``verify``."""

    arm: str
    verify: bool = False

    def __post_init__(self) -> None:
        self.name = f"single:{self.arm}" + (":verified" if self.verify else "")

    def expected_latency_s(self, source: SampleSource) -> float:
        return source.expected_latency_s(self.arm)

    def run(self, source: SampleSource) -> Allocation:
        draws = source.draw(self.arm, 1)
        if not draws:
            return Allocation(None, False, True, (), f"{self.arm}: no sample")
        if self.verify:
            verdicts = source.verify(draws)
            passed = bool(verdicts and verdicts[0])
            return Allocation(draws[0], passed, not passed, tuple(draws), "verified" if passed else "verifier failed")
        return Allocation(draws[0], False, False, tuple(draws), "single run")


@dataclass(repr=False)
class BestOfN(Allocator):
    """``n`` samples of ``arm`` in parallel; the first the verifier passes, else the majority answer (flagged)."""

    arm: str
    n: int

    def __post_init__(self) -> None:
        self.name = f"best_of_{self.n}:{self.arm}"

    def expected_latency_s(self, source: SampleSource) -> float:
        return source.expected_latency_s(self.arm)

    def run(self, source: SampleSource) -> Allocation:
        draws = source.draw(self.arm, self.n)
        verdicts = source.verify(draws)
        for draw, passed in zip(draws, verdicts, strict=False):
            if passed:
                return Allocation(draw, True, False, tuple(draws), "verifier passed")
        return _best_so_far(draws, "no sample passed the verifier")


@dataclass(repr=False)
class AdaptiveSampling(Allocator):
    """Rounds of ``window`` parallel samples of ``arm`` until the verifier passes or answers agree.

    Stops when a sample passes the verifier, when the top answer reaches ``agree_share``
    of at least ``window`` samples (None: never stop on agreement, as with an exact
    verifier), after ``max_n`` samples, or when the next round would not fit the deadline.
    """

    arm: str
    max_n: int
    window: int = 1
    agree_share: float | None = None

    def __post_init__(self) -> None:
        self.name = f"adaptive:{self.arm}:max{self.max_n}:w{self.window}"

    def expected_latency_s(self, source: SampleSource) -> float:
        rounds = -(-self.max_n // self.window)
        return rounds * source.expected_latency_s(self.arm)

    def run(self, source: SampleSource) -> Allocation:
        draws: list[Draw] = []
        while len(draws) < self.max_n:
            if not _fits(source, source.expected_latency_s(self.arm)):
                return _best_so_far(draws, "deadline near: best answer so far")
            batch = source.draw(self.arm, min(self.window, self.max_n - len(draws)))
            if not batch:
                break
            draws.extend(batch)
            for draw, passed in zip(batch, source.verify(batch), strict=False):
                if passed:
                    return Allocation(draw, True, False, tuple(draws), f"verified after {len(draws)} samples")
            if self.agree_share is not None and len(draws) >= self.window and agreement(draws) >= self.agree_share:
                chosen = _best_so_far(draws, "answers agree")
                return Allocation(chosen.draw, False, False, tuple(draws), "answers agree")
        return _best_so_far(draws, f"no verified answer in {len(draws)} samples")


@dataclass(repr=False)
class Cascade(Allocator):
    """Stages from cheap to expensive; the next runs only without a verified answer and if it fits the deadline."""

    stages: tuple[Allocator, ...]

    def __post_init__(self) -> None:
        self.name = " + ".join(stage.name for stage in self.stages)

    def expected_latency_s(self, source: SampleSource) -> float:
        return sum(stage.expected_latency_s(source) for stage in self.stages)

    def run(self, source: SampleSource) -> Allocation:
        seen: list[Draw] = []
        last = Allocation(None, False, True, (), "empty cascade")
        for index, stage in enumerate(self.stages):
            if index > 0 and not _fits(source, stage.expected_latency_s(source)):
                break
            last = stage.run(source)
            seen.extend(last.draws)
            if last.verified:
                return Allocation(last.draw, True, False, tuple(seen), f"{stage.name}: {last.reason}")
        # Nothing verified: the last (most expensive) stage's own answer is the best guess;
        # a majority across stages would let many cheap wrong answers outvote it. A last
        # stage with no answer at all (a failed request) does not beat an earlier answer.
        if last.draw is not None and last.draw.answer:
            return Allocation(last.draw, False, True, tuple(seen), "cascade ended without a verified answer")
        return _best_so_far(seen, "cascade ended without a verified answer")


@dataclass(repr=False)
class AgreementCascade(Allocator):
    """One answer per arm, cheap to expensive, until two answers agree (Mixture-of-Thoughts escalation).

    Needs no verifier: after each arm from the second on, an answer equal to an earlier
    arm's non-empty answer is accepted (unverified, not flagged). Without agreement the
    last arm's answer is taken, flagged. An arm whose expected latency no longer fits the
    deadline ends the cascade.
    """

    arms: tuple[str, ...]

    def __post_init__(self) -> None:
        self.name = "agree:" + " > ".join(self.arms)

    def expected_latency_s(self, source: SampleSource) -> float:
        return sum(source.expected_latency_s(arm) for arm in self.arms)

    def run(self, source: SampleSource) -> Allocation:
        seen: list[Draw] = []
        for index, arm in enumerate(self.arms):
            if index > 0 and not _fits(source, source.expected_latency_s(arm)):
                break
            for draw in source.draw(arm, 1):
                if draw.answer and any(earlier.answer == draw.answer for earlier in seen):
                    return Allocation(draw, False, False, (*seen, draw), f"{arm} agrees with an earlier answer")
                seen.append(draw)
        if seen and seen[-1].answer:
            return Allocation(seen[-1], False, True, tuple(seen), "no two answers agree")
        return _best_so_far(seen, "no two answers agree")


@dataclass(repr=False)
class DeadlineFallback(Allocator):
    """``primary`` when its expected latency fits the time left, else ``fallback``."""

    primary: Allocator
    fallback: Allocator

    def __post_init__(self) -> None:
        self.name = f"({self.primary.name} | {self.fallback.name})"

    def expected_latency_s(self, source: SampleSource) -> float:
        return self.primary.expected_latency_s(source)

    def run(self, source: SampleSource) -> Allocation:
        if _fits(source, self.primary.expected_latency_s(source)):
            return self.primary.run(source)
        return self.fallback.run(source)


#: A difficulty estimate from what a probe saw; never uses correctness.
DifficultyEstimator = Callable[[Sequence[Draw]], str]


def agreement_bins(draws: Sequence[Draw]) -> str:
    """Bin a probe by answer agreement: ``agree`` (>= 2/3), ``split`` (>= 1/3), ``scattered``."""
    share = agreement(draws)
    if share >= 2 / 3:
        return "agree"
    if share >= 1 / 3:
        return "split"
    return "scattered"


@dataclass(repr=False)
class Router(Allocator):
    """Probe cheaply, estimate difficulty without the answer, continue with the strategy chosen for that bin.

    ``probe`` is run first (e.g. a few cheap samples, verified); a verified answer ends the
    task. Otherwise ``estimator`` bins the probe's draws (answer agreement by default, a
    proxy for difficulty that needs no ground truth) and ``routes[bin]`` continues; bins
    never seen in training use ``default``. :func:`sre_agent.policy.evaluate.fit_router`
    fills ``routes`` from the training split.
    """

    probe: Allocator
    routes: dict[str, Allocator] = field(default_factory=dict)
    default: Allocator = field(default_factory=GiveUp)
    estimator: DifficultyEstimator = agreement_bins

    def __post_init__(self) -> None:
        self.name = "router"

    def describe(self) -> str:
        """The probe and the route per difficulty bin, for reports."""
        routes = ", ".join(f"{b} -> {s.name}" for b, s in sorted(self.routes.items()))
        return f"probe {self.probe.name}; {routes}; otherwise {self.default.name}"

    def expected_latency_s(self, source: SampleSource) -> float:
        return self.probe.expected_latency_s(source)

    def run(self, source: SampleSource) -> Allocation:
        first = self.probe.run(source)
        if first.verified:
            return first
        route = self.routes.get(self.estimator(first.draws), self.default)
        rest = route.run(source)
        draws = (*first.draws, *rest.draws)
        if rest.verified:
            return Allocation(rest.draw, True, False, draws, f"{route.name}: {rest.reason}")
        if rest.draw is not None:  # the route's own best guess beats the probe's
            return Allocation(rest.draw, False, True, draws, f"routed to {route.name}, no verified answer")
        return _best_so_far(draws, f"routed to {route.name}, no verified answer")
