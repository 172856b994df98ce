"""Allocation strategies on a scripted sample source: stopping, deadlines, composition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sre_agent.policy.allocate import (
    AdaptiveSampling,
    AgreementCascade,
    BestOfN,
    Cascade,
    DeadlineFallback,
    Draw,
    GiveUp,
    Router,
    SingleRun,
    agreement,
)


@dataclass
class Source:
    """Arms of (answer, ok) samples; every draw takes ``latency`` seconds and $1."""

    arms: dict[str, list[tuple[str, bool]]]
    latency: dict[str, float]
    deadline_s: float | None = None
    elapsed_s: float = 0.0
    spend: float = 0.0
    cursor: dict[str, int] = field(default_factory=dict)
    truth: dict[int, bool] = field(default_factory=dict)

    def remaining_s(self) -> float | None:
        return None if self.deadline_s is None else self.deadline_s - self.elapsed_s

    def expected_latency_s(self, arm: str) -> float:
        return self.latency[arm]

    def draw(self, arm: str, n: int = 1) -> list[Draw]:
        start = self.cursor.get(arm, 0)
        chosen = self.arms[arm][start : start + n]
        self.cursor[arm] = start + len(chosen)
        self.elapsed_s += self.latency[arm] if chosen else 0.0
        self.spend += len(chosen)
        draws = []
        for answer, ok in chosen:
            key = len(self.truth)
            self.truth[key] = ok
            draws.append(Draw(key, arm, answer, 1.0, self.latency[arm]))
        return draws

    def verify(self, draws: Sequence[Draw]) -> list[bool]:
        return [self.truth[d.key] for d in draws]


def test_adaptive_sampling_stops_at_the_first_verified_answer() -> None:
    source = Source({"cheap": [("a", False), ("b", False), ("24", True), ("c", False)]}, {"cheap": 1.0})
    result = AdaptiveSampling("cheap", max_n=10).run(source)
    assert result.verified
    assert result.draw is not None
    assert result.draw.answer == "24"
    assert source.spend == 3
    assert not result.flagged


def test_adaptive_sampling_returns_best_so_far_flagged_when_the_deadline_nears() -> None:
    arms = {"cheap": [("x", False), ("y", False), ("x", False), ("24", True)]}
    source = Source(arms, {"cheap": 2.0}, deadline_s=5.0)
    result = AdaptiveSampling("cheap", max_n=10).run(source)
    assert result.flagged
    assert not result.verified
    assert result.draw is not None
    assert result.draw.answer == "x"
    assert source.elapsed_s <= 5.0
    assert source.spend == 2


def test_agreement_stops_without_a_verifier() -> None:
    source = Source({"arm": [("7", False), ("7", False), ("7", False), ("8", False)]}, {"arm": 1.0})
    result = AdaptiveSampling("arm", max_n=10, window=3, agree_share=0.6).run(source)
    assert result.reason == "answers agree"
    assert source.spend == 3
    assert agreement(result.draws) == 1.0


def test_cascade_and_deadline_fallback_compose() -> None:
    arms = {"cheap": [("a", False)] * 5, "strong": [("24", True)]}
    source = Source(arms, {"cheap": 1.0, "strong": 10.0})
    cascade = AdaptiveSampling("cheap", 5, 5) + SingleRun("strong", verify=True)
    assert isinstance(cascade, Cascade)
    assert len(cascade.stages) == 2
    result = cascade.run(source)
    assert result.verified
    assert source.spend == 6
    tight = Source(arms, {"cheap": 1.0, "strong": 10.0}, deadline_s=5.0)
    either = SingleRun("strong", verify=True) | BestOfN("cheap", 3)
    assert isinstance(either, DeadlineFallback)
    fallback = either.run(tight)
    assert not fallback.verified
    assert tight.cursor == {"cheap": 3}


def test_router_routes_by_probe_agreement() -> None:
    arms = {"cheap": [("9", False), ("9", False), ("9", False)], "strong": [("24", True)], "mid": [("1", False)]}
    router = Router(BestOfN("cheap", 3), routes={"agree": SingleRun("strong", verify=True)}, default=GiveUp())
    result = router.run(Source(arms, {"cheap": 1.0, "strong": 5.0, "mid": 1.0}))
    assert result.verified
    assert "strong" in result.reason
    scattered = {"cheap": [("1", False), ("2", False), ("3", False)], "strong": [("24", True)]}
    source = Source(scattered, {"cheap": 1.0, "strong": 5.0})
    assert not router.run(source).verified
    assert source.spend == 3


def test_agreement_cascade_stops_when_two_arms_agree_and_flags_the_last_answer_otherwise() -> None:
    arms = {"s": [("7", False)], "m": [("7", False)], "l": [("24", True)]}
    source = Source(arms, {"s": 1.0, "m": 2.0, "l": 5.0})
    agreed = AgreementCascade(("s", "m", "l")).run(source)
    assert agreed.draw is not None
    assert (agreed.draw.arm, agreed.flagged, agreed.verified) == ("m", False, False)
    assert "l" not in source.cursor  # the expensive arm was never called
    split = {"s": [("7", False)], "m": [("", False)], "l": [("24", True)]}
    source = Source(split, {"s": 1.0, "m": 2.0, "l": 5.0})
    last = AgreementCascade(("s", "m", "l")).run(source)
    assert last.draw is not None
    assert (last.draw.arm, last.flagged) == ("l", True)  # an empty answer agrees with nothing
    tight = Source(split, {"s": 1.0, "m": 2.0, "l": 5.0}, deadline_s=4.0)
    cut = AgreementCascade(("s", "m", "l")).run(tight)
    assert "l" not in tight.cursor
    assert cut.draw is not None
    assert cut.draw.answer == "7"  # the best answer so far, flagged
    assert cut.flagged
