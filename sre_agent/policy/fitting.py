"""Fitting adaptive allocation policies on the training part of a task table.

Three families, each a small grid scored on training tasks only:

- ``adaptive_bon:<arm>``: sample ``arm`` in rounds until the verifier passes (max n, window).
- ``cascade``: adaptive sampling of the cheapest multi-sample arm, then one verified run of
  a more expensive arm.
- ``router``: a cheap probe, a difficulty bin from the probe's answer agreement, and per
  bin the continuation chosen by a Lagrangian trade of dollars against successes.

Tables with no multi-sample arm are fitted by :mod:`sre_agent.policy.single` instead.

The target is the best fixed policy on the training part (highest success, then fewest
deadline misses): a candidate that matches its success and miss rate at lower spend per
success wins; when none does, the one with the highest success does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sre_agent.policy.allocate import AdaptiveSampling, Allocator, GiveUp, Router, SingleRun, agreement_bins
from sre_agent.policy.evaluate import Fitted, PolicyRun, Replay, Task, describe_training, fit_best, score, summarize

__all__ = ["adaptive_candidates", "fit_router"]

_MAX_N = (2, 5, 10, 20, 50, 100)
_WINDOWS = (1, 5, 10)
# Dollars one success is worth, for the router's per-bin choice (log grid, 0.1 cent to $100).
_LAMBDAS = tuple(10 ** (k / 4) for k in range(-12, 9))


def _arm_shapes(train: Sequence[Task]) -> tuple[list[str], list[str]]:
    """(multi-sample arms sorted by mean cost, every arm sorted by mean cost) over the training part."""
    arms = set.intersection(*(set(t.arms) for t in train))
    mean_cost = {
        arm: sum(s.cost_usd for t in train for s in t.arms[arm]) / max(sum(len(t.arms[arm]) for t in train), 1)
        for arm in arms
    }
    ordered = sorted(arms, key=lambda a: (mean_cost[a], a))
    multi = [a for a in ordered if min(len(t.arms[a]) for t in train) >= 2]
    return multi, ordered


def _min_samples(train: Sequence[Task], arm: str) -> int:
    return min(len(t.arms[arm]) for t in train)


def adaptive_candidates(train: Sequence[Task], replay: Replay, target: dict[str, Any]) -> dict[str, Fitted]:
    """Every adaptive policy fitted on ``train``, by report name.

    A table whose arms all hold a single outcome per task gets the single-outcome
    families instead (:mod:`sre_agent.policy.single`: verifier cascades, feature routing).
    """
    multi, ordered = _arm_shapes(train)
    if not multi:
        from sre_agent.policy.single import fit_single_outcome

        return fit_single_outcome(train, replay, target)
    fitted: dict[str, Fitted] = {}
    for arm in multi:
        limit = _min_samples(train, arm)
        grid: list[Allocator] = [AdaptiveSampling(arm, n, w) for n in _MAX_N if n <= limit for w in _WINDOWS if w <= n]
        fitted[f"adaptive_bon:{arm}"] = fit_best(f"adaptive_bon:{arm}", grid, train, replay, target)
    if multi:
        cheap = multi[0]
        cascades = _cascades(train, multi, ordered)
        if cascades:
            fitted["cascade"] = fit_best("cascade", cascades, train, replay, target)
        fitted["router"] = fit_router(train, replay, target, cheap=cheap, multi=multi, ordered=ordered)
    return fitted


def _cascades(train: Sequence[Task], multi: Sequence[str], ordered: Sequence[str]) -> list[Allocator]:
    """Cheap-to-expensive cascades: a window of the cheapest arm, optionally adaptive sampling of the
    next multi-sample arm, then one verified run of a more expensive arm."""
    cheap = multi[0]
    limit = {arm: _min_samples(train, arm) for arm in multi}
    firsts = [AdaptiveSampling(cheap, n, w) for n in (5, 10, 20, 50) if n <= limit[cheap] for w in (5, 10) if w <= n]
    middles: list[AdaptiveSampling | None] = [None]
    middles += [AdaptiveSampling(arm, m, 10) for arm in multi[1:] for m in (10, 20, 30, 50) if m <= limit[arm]]
    lasts = [SingleRun(arm, verify=True) for arm in ordered if arm != cheap]
    cascades: list[Allocator] = []
    for first in firsts:
        for middle in middles:
            for last in lasts:
                if middle is not None and middle.arm == last.arm:
                    continue
                cascades.append(first + middle + last if middle is not None else first + last)
    return cascades


def _bins(probe: Allocator, train: Sequence[Task], replay: Replay) -> list[str]:
    """Each training task's difficulty bin after ``probe`` ('solved' when the probe verified an answer)."""
    bins = []
    for task in train:
        allocation = probe.run(replay.source(task))
        bins.append("solved" if allocation.verified else agreement_bins(allocation.draws))
    return bins


def _bin_value(
    runs: Sequence[PolicyRun], members: Sequence[int], dollars_per_success: float, misses_per_success: float
) -> float:
    """Net value of a continuation on one bin's tasks: successes priced in dollars, minus spend.

    A deadline miss costs ``misses_per_success`` successes; the grid over it lets the
    feasibility check (misses no worse than the best fixed policy) pick the trade-off.
    """
    picked = [runs[i] for i in members]
    return sum(dollars_per_success * (r.success - misses_per_success * r.missed) - r.spend_usd for r in picked)


def fit_router(
    train: Sequence[Task],
    replay: Replay,
    target: dict[str, Any],
    *,
    cheap: str,
    multi: Sequence[str],
    ordered: Sequence[str],
) -> Fitted:
    """Choose the probe and, per difficulty bin, the continuation (see the module docstring)."""
    limit = {arm: _min_samples(train, arm) for arm in multi}
    continuations: list[Allocator] = [GiveUp()]
    continuations += [AdaptiveSampling(a, m, 10) for a in multi for m in (10, 20, 50) if m <= limit[a]]
    continuations += [SingleRun(b, verify=True) for b in ordered]
    continuations += [
        AdaptiveSampling(a, m, 10) + SingleRun(b, verify=True)
        for a in multi
        for m in (10, 20)
        if m <= limit[a]
        for b in ordered
        if b != a
    ]
    best: tuple[tuple[int, float, float], Router, dict[str, Any]] | None = None
    for k in (5, 10):
        if k > limit[cheap]:
            continue
        probe = AdaptiveSampling(cheap, k, k)
        bins = _bins(probe, train, replay)
        runs = {id(c): replay.runs(Router(probe, default=c), train) for c in continuations}
        for lam, mu in [(lam, mu) for lam in _LAMBDAS for mu in (0.0, 1.0, 10.0)]:
            routes: dict[str, Allocator] = {}
            for bin_name in sorted(set(bins) - {"solved"}):
                members = [i for i, b in enumerate(bins) if b == bin_name]
                values = [_bin_value(runs[id(c)], members, lam, mu) for c in continuations]
                routes[bin_name] = continuations[values.index(max(values))]
            router = Router(probe, routes=routes, default=GiveUp())
            summary = summarize("router", "adaptive", replay.runs(router, train))
            key = score(summary, target)
            if best is None or key < best[0]:
                best = (key, router, summary)
    if best is None:
        router = Router(AdaptiveSampling(cheap, 1, 1))
        return Fitted(router, summarize("router", "adaptive", replay.runs(router, train)), ["router: no probe fits"])
    _, router, summary = best
    candidates = sum(k <= limit[cheap] for k in (5, 10)) * len(_LAMBDAS) * 3
    return Fitted(router, summary, [f"router: {router.describe()} {describe_training(summary)}"], candidates)
