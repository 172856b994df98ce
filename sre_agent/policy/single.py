"""Fitting policies over single-outcome arms: verifier cascades and routing by task features.

When every arm holds one outcome per task (one small-model answer, one large-model
answer, one verifier-selected best-of-n answer, ...), adaptive sampling has nothing
to sample. What is left to decide is *which arms to try, in which order, and where to
stop* (FrugalGPT-style cascades: run an arm, ask the verifier, accept or escalate), and
*which of those to use for which task* (routing by features known before any call).

- ``cascade``: every order of up to four arms (cheap-to-expensive subsets only when there
  are more than five arms); each stage but the last is verified (its cost and latency
  charged, its verdict simulated from the table's rates with the evaluation seed) and
  accepted when it passes; the last stage's answer is taken as is (verifying it could
  change nothing). Scored on the training part like every adaptive family (see
  :func:`sre_agent.policy.evaluate.score`): matching the best fixed policy's success and
  deadline misses at the lowest spend per success; the deadline cuts a stage that no
  longer fits, and the dollar budget refuses a draw that no longer fits.
- ``router``: a :class:`~sre_agent.policy.routing.FeatureRouter` whose bins of predicted
  solvability each run the candidate (a cascade, one arm, or giving up) with the best
  Lagrangian value (dollars per success ``lambda``, misses priced at ``mu`` successes);
  bins, ``lambda`` and ``mu`` are chosen by the same training score, with the target's
  success raised by one standard error (a guard against fitting the bins to noise). When the features
  carry nothing (cross-validated log-loss gain under 2 %), the router is the cascade.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from sre_agent.policy.allocate import Allocator, GiveUp, SingleRun
from sre_agent.policy.evaluate import Fitted, PolicyRun, Replay, Task, describe_training, score, summarize
from sre_agent.policy.routing import FeatureRouter, cross_validated_gain, fit_solvability

__all__ = ["cascade_candidates", "fit_feature_router", "fit_single_outcome", "single_outcome_arms"]

MAX_STAGES = 4
#: Above this many arms only cheap-to-expensive orders are tried (permutations grow too fast).
PERMUTE_UP_TO = 5
#: Relative out-of-fold log-loss gain below which features are said to carry nothing.
MIN_FEATURE_GAIN = 0.02
_LAMBDAS = tuple(10 ** (k / 4) for k in range(-16, 9))  # dollars per success, 1e-4 .. 100
_MUS = (0.0, 1.0, 10.0)
_BINS = (2, 3, 4)


def single_outcome_arms(train: Sequence[Task]) -> list[str]:
    """Arms present in every training task, cheapest first (mean dollars per sample)."""
    arms = set.intersection(*(set(t.arms) for t in train))
    mean_cost = {
        arm: sum(s.cost_usd for t in train for s in t.arms[arm][:1]) / max(sum(bool(t.arms[arm]) for t in train), 1)
        for arm in arms
    }
    return sorted(arms, key=lambda a: (mean_cost[a], a))


def cascade_candidates(arms: Sequence[str], max_stages: int = MAX_STAGES) -> list[Allocator]:
    """Cascades of two or more single-outcome stages (see the module docstring); ``arms`` cheapest first."""
    if len(arms) <= PERMUTE_UP_TO:
        orders: list[tuple[str, ...]] = [
            order for k in range(2, min(max_stages, len(arms)) + 1) for order in itertools.permutations(arms, k)
        ]
    else:
        orders = [order for k in range(2, min(max_stages, len(arms)) + 1) for order in itertools.combinations(arms, k)]
    cascades: list[Allocator] = []
    for order in orders:
        stages = [SingleRun(arm, verify=True) for arm in order[:-1]]
        cascade: Allocator = stages[0]
        for stage in [*stages[1:], SingleRun(order[-1])]:
            cascade = cascade + stage
        cascades.append(cascade)
    return cascades


def fit_single_outcome(train: Sequence[Task], replay: Replay, target: dict[str, Any]) -> dict[str, Fitted]:
    """The fitted ``cascade`` and ``router`` for a table whose arms hold one outcome each.

    Empty when there is nothing to adapt: fewer than two arms, or no verifier to
    accept or escalate with.
    """
    arms = single_outcome_arms(train)
    if len(arms) < 2 or any(t.verifier is None for t in train):
        return {}
    candidates = cascade_candidates(arms)
    runs = [replay.runs(c, train) for c in candidates]
    summaries = [summarize("cascade", "adaptive", r) for r in runs]
    best = min(range(len(candidates)), key=lambda i: score(summaries[i], target))
    cascade = Fitted(
        candidates[best],
        summaries[best],
        [f"cascade: chose {candidates[best].name} {describe_training(summaries[best])}"],
        len(candidates),
    )
    pool: list[Allocator] = [GiveUp(), *(SingleRun(arm) for arm in arms), *candidates]
    pool_runs = [replay.runs(GiveUp(), train), *(replay.runs(SingleRun(arm), train) for arm in arms), *runs]
    return {"cascade": cascade, "router": fit_feature_router(train, target, pool, pool_runs, cascade)}


def _value(runs: Sequence[PolicyRun], members: Sequence[int], dollars_per_success: float, miss_weight: float) -> float:
    """Successes priced in dollars, minus spend, with a miss costing ``miss_weight`` successes."""
    return sum(
        dollars_per_success * (runs[i].success - miss_weight * runs[i].missed) - runs[i].spend_usd for i in members
    )


def _best_for(pool_runs: Sequence[Sequence[PolicyRun]], members: Sequence[int], lam: float, mu: float) -> int:
    """Index of the pool entry with the highest value on ``members`` (the first on ties)."""
    values = [_value(runs, members, lam, mu) for runs in pool_runs]
    return values.index(max(values))


def fit_feature_router(
    train: Sequence[Task],
    target: dict[str, Any],
    pool: Sequence[Allocator],
    pool_runs: Sequence[Sequence[PolicyRun]],
    fallback: Fitted,
) -> Fitted:
    """A :class:`FeatureRouter` over ``pool`` (whose training runs are ``pool_runs``), or ``fallback``.

    The solvability target of a training task is the share of arms whose (first) outcome
    is correct; only training labels are used.
    """
    rows = [t.features for t in train]
    targets = [sum(samples[0].correct for samples in t.arms.values() if samples) / max(len(t.arms), 1) for t in train]
    gain = cross_validated_gain(rows, targets)
    if gain < MIN_FEATURE_GAIN:
        note = (
            f"router: the features carry nothing (out-of-fold log-loss gain {gain:.1%} < {MIN_FEATURE_GAIN:.0%}); "
            f"routing falls back to the cascade {fallback.policy.name}"
        )
        return Fitted(fallback.policy, fallback.train, [note], fallback.candidates)
    model = fit_solvability(rows, targets)
    # Per-bin choices have many degrees of freedom: the cheapest feasible router sits right at
    # the target on training tasks and below it on new ones half the time. Asking for one
    # standard error of the target's success above it keeps the choice feasible out of sample.
    p = target["success_rate"]
    guarded = {**target, "success_rate": p + (p * (1 - p) / len(train)) ** 0.5}
    scores = [model.predict(row) for row in rows]
    ordered = sorted(scores)
    best: tuple[tuple[int, float, float], FeatureRouter, dict[str, Any]] | None = None
    for bins in _BINS:
        cuts = tuple(ordered[min(len(ordered) * k // bins, len(ordered) - 1)] for k in range(1, bins))
        members = [[i for i, s in enumerate(scores) if sum(s >= c for c in cuts) == b] for b in range(bins)]
        for lam, mu in itertools.product(_LAMBDAS, _MUS):
            chosen = [_best_for(pool_runs, m, lam, mu) for m in members]
            combined = [pool_runs[chosen[b]][i] for b, m in enumerate(members) for i in m]
            summary = summarize("router", "adaptive", combined)
            key = score(summary, guarded)
            if best is None or key < best[0]:
                best = (key, FeatureRouter(model, cuts, tuple(pool[j] for j in chosen)), summary)
    assert best is not None  # _BINS and _LAMBDAS are non-empty
    _, router, summary = best
    return Fitted(
        router,
        summary,
        [
            f"router: features predict solvability (out-of-fold log-loss gain {gain:.1%}); "
            f"{router.describe()} {describe_training(summary)}"
        ],
        len(_BINS) * len(_LAMBDAS) * len(_MUS),
    )
