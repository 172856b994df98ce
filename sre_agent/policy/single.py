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
  bins, ``lambda`` and ``mu`` are chosen by the same score computed out of fold (five folds
  of the training part: each task routed by choices fitted on the others) against the
  target's success plus one standard error: guards against fitting bins to noise. When the features
  carry nothing (cross-validated log-loss gain under 2 %), the router is the cascade.
- Tables without a verifier get *agreement* cascades instead (as in "LLM Cascades with
  Mixture of Thoughts"): one answer per arm until two arms agree, else the last arm's.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from sre_agent.policy.allocate import AgreementCascade, Allocator, GiveUp, SingleRun
from sre_agent.policy.evaluate import (
    Fitted,
    PolicyRun,
    Replay,
    Task,
    describe_training,
    fit_reason,
    score,
    summarize,
)
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


def cascade_candidates(arms: Sequence[str], max_stages: int = MAX_STAGES, verified: bool = True) -> list[Allocator]:
    """Cascades of two or more single-outcome stages (see the module docstring); ``arms`` cheapest first.

    ``verified=False`` (a table without a verifier) gives agreement cascades instead.
    """
    if len(arms) <= PERMUTE_UP_TO:
        orders: list[tuple[str, ...]] = [
            order for k in range(2, min(max_stages, len(arms)) + 1) for order in itertools.permutations(arms, k)
        ]
    else:
        orders = [order for k in range(2, min(max_stages, len(arms)) + 1) for order in itertools.combinations(arms, k)]
    cascades: list[Allocator] = []
    if not verified:
        # Without a verifier the escalation signal is agreement: at least three arms so a
        # disagreement has somewhere to go.
        return [AgreementCascade(order) for order in orders if len(order) >= 3]
    for order in orders:
        stages = [SingleRun(arm, verify=True) for arm in order[:-1]]
        cascade: Allocator = stages[0]
        for stage in [*stages[1:], SingleRun(order[-1])]:
            cascade = cascade + stage
        cascades.append(cascade)
    return cascades


def fit_single_outcome(train: Sequence[Task], replay: Replay, target: dict[str, Any]) -> dict[str, Fitted]:
    """The fitted ``cascade`` and ``router`` for a table whose arms hold one outcome each.

    Without a verifier the cascades escalate on disagreement (``agree:`` candidates, at
    least three arms); empty when there is nothing to adapt (too few arms).
    """
    arms = single_outcome_arms(train)
    verified = all(t.verifier is not None for t in train)
    candidates = cascade_candidates(arms, verified=verified)
    if not candidates:
        return {}
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


def _quantile_cuts(scores: Sequence[float], bins: int) -> tuple[float, ...]:
    """Thresholds splitting ``scores`` into ``bins`` groups of about equal size."""
    ordered = sorted(scores)
    return tuple(ordered[min(len(ordered) * k // bins, len(ordered) - 1)] for k in range(1, bins))


class _RunTable:
    """Training runs of every pool entry as arrays (entries x tasks), for fast per-bin choices."""

    FOLDS = 5

    def __init__(self, pool_runs: Sequence[Sequence[PolicyRun]]) -> None:
        import numpy as np

        self.np = np
        self.success = np.array([[r.success for r in runs] for runs in pool_runs], dtype=float)
        self.missed = np.array([[r.missed for r in runs] for runs in pool_runs], dtype=float)
        self.spend = np.array([[r.spend_usd for r in runs] for runs in pool_runs], dtype=float)
        self.fold = np.arange(self.success.shape[1]) % self.FOLDS

    def best(self, lam: float, mu: float, members: Sequence[int]) -> int:
        """The entry with the highest value on ``members``; the first on ties.

        Value: successes priced at ``lam`` dollars, a deadline miss costing ``mu`` successes, minus spend.
        """
        values = (lam * (self.success - mu * self.missed) - self.spend)[:, list(members)].sum(axis=1)
        return int(self.np.argmax(values))

    def choose_out_of_fold(self, bin_of: Sequence[int], bins: int, lam: float, mu: float) -> Any:
        """Per task, the entry its bin chooses when fitted on the other folds."""
        np = self.np
        values = lam * (self.success - mu * self.missed) - self.spend
        bin_array = np.asarray(bin_of)
        chosen = np.zeros(len(bin_of), dtype=int)
        for fold in range(self.FOLDS):
            for b in range(bins):
                in_bin = bin_array == b
                fit = in_bin & (self.fold != fold)
                if fit.any():
                    chosen[in_bin & (self.fold == fold)] = int(np.argmax(values[:, fit].sum(axis=1)))
        return chosen

    def summary(self, chosen: Any) -> dict[str, Any]:
        """Success rate, miss rate and spend per success when task ``i`` runs entry ``chosen[i]``."""
        tasks = self.np.arange(len(chosen))
        successes = float(self.success[chosen, tasks].sum())
        spend = float(self.spend[chosen, tasks].sum())
        return {
            "success_rate": successes / len(chosen),
            "deadline_miss_rate": float(self.missed[chosen, tasks].mean()),
            "spend_per_success_usd": spend / successes if successes else None,
        }


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
        why = f"the features carry nothing, so the cascade: {fit_reason(fallback, target)}"
        return Fitted(fallback.policy, fallback.train, [note], fallback.candidates, why)
    model = fit_solvability(rows, targets)
    scores = [model.predict(row) for row in rows]
    table = _RunTable(pool_runs)
    # The target's own training success is an estimate too: asking for one standard error
    # more keeps a router that trades every spare success for dollars from falling below
    # the target on new tasks about half the time.
    p = target["success_rate"]
    guarded = {**target, "success_rate": p + (p * (1 - p) / len(train)) ** 0.5}
    best: tuple[tuple[int, float, float], int, float, float] | None = None
    for bins in _BINS:
        cuts = _quantile_cuts(scores, bins)
        bin_of = [sum(s >= c for c in cuts) for s in scores]
        for lam, mu in itertools.product(_LAMBDAS, _MUS):
            # Out-of-fold: each task is routed by choices fitted on the other folds, so the
            # configuration is judged on tasks its per-bin choices never saw.
            held_out = table.choose_out_of_fold(bin_of, bins, lam, mu)
            key = score(table.summary(held_out), guarded)
            if best is None or key < best[0]:
                best = (key, bins, lam, mu)
    assert best is not None  # _BINS and _LAMBDAS are non-empty
    key, bins, lam, mu = best
    configurations = len(_BINS) * len(_LAMBDAS) * len(_MUS)
    if key[0] == 0:
        why = (
            f"the lowest out-of-fold training spend per success among {configurations} configurations that match "
            f"{target['name']}'s training success plus one standard error ({guarded['success_rate']:.3f}) and its "
            f"deadline misses ({target['deadline_miss_rate']:.3f}): {bins} bins, ${lam:.3g} per success"
        )
    else:
        why = f"none of {configurations} configurations matched {target['name']} out of fold: the highest success"
    cuts = _quantile_cuts(scores, bins)
    bin_of = [sum(s >= c for c in cuts) for s in scores]
    chosen = [table.best(lam, mu, [i for i, b in enumerate(bin_of) if b == k]) for k in range(bins)]
    router = FeatureRouter(model, cuts, tuple(pool[j] for j in chosen))
    summary = summarize("router", "adaptive", [pool_runs[chosen[b]][i] for i, b in enumerate(bin_of)])
    return Fitted(
        router,
        summary,
        [
            f"router: features predict solvability (out-of-fold log-loss gain {gain:.1%}); "
            f"{router.describe()} {describe_training(summary)}"
        ],
        configurations,
        why,
    )
