"""When the tokens-per-step distribution says the step budget moved (``_steps.BatchShape.changed``)."""

from __future__ import annotations

import pytest

from sre_agent.analysis.histogram_delta import HistogramDelta
from sre_agent.analysis.rules_api import SidePair
from sre_agent.rules._engine_cost import MIN_SLOWDOWN
from sre_agent.rules._steps import ABOVE_BUDGET_P, BatchShape, StepMix, StepsAbove, steps_above


def _shape(
    p99: tuple[float, float], cap: tuple[float, float], work_ratio: float = 1.0, above: StepsAbove | None = None
) -> BatchShape:
    flat = SidePair(30.0, 30.0)
    return BatchShape(mean=flat, p90=flat, p99=SidePair(*p99), steps=SidePair(9e4, 9e4), cap=SidePair(*cap),
                      work_ratio=work_ratio, above=above)  # fmt: skip


BOUNDS = (8.0, 512.0, 1024.0, 2048.0)


def _steps(blocks: list[tuple[int, ...]]) -> HistogramDelta:
    """A tokens-per-step histogram of the given per-scrape-interval counts (buckets: BOUNDS and +Inf)."""
    counts = tuple(sum(col) for col in zip(*blocks, strict=True))
    return HistogramDelta(BOUNDS, counts, 0.0, tuple(blocks))


def test_steps_above_every_baseline_step_are_counted_by_scrape_interval() -> None:
    # Ten baseline intervals whose largest steps sit in (512, 1024]; three of ten candidate
    # intervals hold steps above it (2, 1 and 4 of them). Were the twenty intervals alike, all
    # three tops would be the candidate's with chance C(10, 3) / C(20, 3) = 720 / 6840.
    baseline = _steps([(50, 5, 1, 0, 0)] * 10)
    candidate = _steps([(50, 5, 1, 2, 0), (50, 5, 0, 0, 1), (50, 5, 1, 0, 4)] + [(50, 5, 1, 0, 0)] * 7)
    above = steps_above(baseline, candidate)
    assert above == StepsAbove(steps=7, blocks=3, p=pytest.approx(720 / 6840))
    # The same intervals on both sides: nothing above.
    assert steps_above(baseline, baseline) == StepsAbove(0, 0, 1.0)
    # Too few intervals to read, or a baseline already in the +Inf bucket: no test.
    assert steps_above(_steps([(50, 5, 1, 0, 0)] * 4), candidate) is None
    assert steps_above(_steps([(50, 5, 1, 0, 1)] * 10), candidate) is None


def test_steps_beyond_the_baseline_budget_in_many_intervals_are_a_raise() -> None:
    tested = StepsAbove(steps=300, blocks=20, p=ABOVE_BUDGET_P / 10)
    chance = StepsAbove(steps=3, blocks=2, p=0.25)
    # Chunked prefill off: the p99 step (mostly decodes) stays, the largest steps pass the old budget.
    assert _shape((5765.0, 5373.0), (8192.0, 16384.0), above=tested).changed
    assert not _shape((5765.0, 5373.0), (8192.0, 16384.0), above=chance).changed
    # Longer prompts pass it too: at other prefill work per request it is the prompts'.
    assert not _shape((5765.0, 5373.0), (8192.0, 16384.0), work_ratio=1.3, above=tested).changed


def test_a_cut_below_long_prompts_lowers_the_cap_and_raises_the_p99() -> None:
    # max_num_batched_tokens 16384 -> 256 with ~4,000-token prompts: each prompt's one big step
    # becomes 16 chunks of 256, so budget-sized steps become common (p99 15 -> 246 tokens)
    # while the largest step falls to the budget. Before, the two had to move the same way.
    assert _shape((15.3, 246.0), (16384.0, 256.0)).changed


def test_a_cut_or_raise_that_moves_both_the_same_way() -> None:
    assert _shape((2000.0, 240.0), (4096.0, 256.0)).changed
    assert _shape((240.0, 2000.0), (256.0, 4096.0)).changed


def test_the_largest_steps_two_buckets_smaller_at_the_same_work_are_a_cut() -> None:
    # 4096 -> 256 where the p99 step was below both budgets (311 -> 227 tokens): only the
    # largest steps show it. Before, the p99 had to move x1.5 too.
    assert _shape((311.0, 227.0), (4096.0, 256.0), work_ratio=1.03).changed
    # The same fall with half the prompt work per request is the prompts', not the budget's.
    assert not _shape((311.0, 227.0), (4096.0, 256.0), work_ratio=0.5).changed
    # One bucket alone is not enough.
    assert not _shape((311.0, 227.0), (4096.0, 2048.0)).changed


def test_busier_steps_under_a_pinned_budget_are_not_a_budget_change() -> None:
    # More arrivals (or slower steps gathering more of them) raise the p99, not the cap.
    assert not _shape((200.0, 600.0), (8192.0, 8192.0)).changed
    # Longer prompts raise both, and the p99 rise is the work's (work-adjusted it is flat).
    assert not _shape((200.0, 600.0), (2048.0, 8192.0), work_ratio=3.0).changed


def test_the_step_fit_bounds_the_rise_of_a_prompt_tokens_cost() -> None:
    # The upper 95 % bound of g's relative rise: 1 % +- 1e-6 s/token on a 1e-4 baseline stays below
    # MIN_SLOWDOWN (no slower prefill path); a 50 % rise does not; unknown parts give no bound.
    flat = StepMix(0.0, 0.0, SidePair(100.0, 100.0), prefill_cost=SidePair(1e-4, 1.01e-4), prefill_cost_se=1e-6)
    bound = flat.prefill_cost_rise_bound()
    assert bound == pytest.approx((1e-6 + 1.96e-6) / 1e-4)
    assert bound < MIN_SLOWDOWN
    slower = StepMix(0.0, 0.0, SidePair(100.0, 100.0), prefill_cost=SidePair(1e-4, 1.5e-4), prefill_cost_se=1e-6)
    assert (slower.prefill_cost_rise_bound() or 0.0) > MIN_SLOWDOWN
    assert StepMix(0.0, 0.0, SidePair(100.0, 100.0)).prefill_cost_rise_bound() is None
    zero = StepMix(0.0, 0.0, SidePair(1.0, 1.0), prefill_cost=SidePair(0.0, 1e-4), prefill_cost_se=1e-6)
    assert zero.prefill_cost_rise_bound() is None


def test_the_step_fit_floors_the_rise_of_a_prompt_tokens_cost() -> None:
    # The lower 95 % bound: a 50 % rise +- 1e-5 s/token on 1e-4 clears MIN_SLOWDOWN (a slower
    # prefill path, which a step budget cannot cause); the same rise twice as noisy does not.
    sure = StepMix(0.0, 0.0, SidePair(100.0, 100.0), prefill_cost=SidePair(1e-4, 1.5e-4), prefill_cost_se=1e-5)
    assert sure.prefill_cost_rise_floor() == pytest.approx((5e-5 - 1.96e-5) / 1e-4)
    assert (sure.prefill_cost_rise_floor() or 0.0) >= MIN_SLOWDOWN
    noisy = StepMix(0.0, 0.0, SidePair(100.0, 100.0), prefill_cost=SidePair(1e-4, 1.5e-4), prefill_cost_se=2.5e-5)
    assert (noisy.prefill_cost_rise_floor() or 0.0) < MIN_SLOWDOWN
    assert StepMix(0.0, 0.0, SidePair(100.0, 100.0)).prefill_cost_rise_floor() is None
