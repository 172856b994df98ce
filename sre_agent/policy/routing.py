"""Routing by task features known before any call (prompt length, task-type tags, numeric features).

A :class:`SolvabilityModel` is a logistic regression (L2-penalised, fitted by Newton's
method on the training part) predicting the share of arms that solve a task from its
features: a difficulty estimate in the spirit of Snell et al. (2024), who allocate
test-time compute by predicted difficulty. Its log-loss is the fitting criterion, so
its probabilities are calibrated on the training distribution; prediction is plain
Python, so a gateway needs no numpy.

A :class:`FeatureRouter` bins that prediction and runs the allocator chosen for the bin
(a cascade, one arm, or giving up); :func:`sre_agent.policy.single.fit_feature_router`
chooses the bins and routes on the training part and falls back to the cascade when the
features carry nothing (cross-validated log-loss no better than the base rate's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sre_agent.policy.allocate import Allocation, Allocator, SampleSource

__all__ = ["FeatureRouter", "FeatureSource", "SolvabilityModel", "cross_validated_gain", "fit_solvability"]


@runtime_checkable
class FeatureSource(Protocol):
    """A sample source that also knows the task's features before any call."""

    def features(self) -> Mapping[str, float]:
        """Feature name -> value (a missing name counts as 0)."""
        ...


@dataclass(frozen=True, slots=True)
class SolvabilityModel:
    """``P(an arm solves the task | features)``: standardised features, then a logistic function."""

    names: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]  # one per name
    intercept: float

    def predict(self, features: Mapping[str, float]) -> float:
        """Predicted solvability in (0, 1)."""
        z = self.intercept
        for name, mu, sd, w in zip(self.names, self.mean, self.scale, self.weights, strict=True):
            z += w * (features.get(name, 0.0) - mu) / sd
        return 1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready parameters (for handing a fitted router to a gateway)."""
        return {
            "names": list(self.names),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "weights": list(self.weights),
            "intercept": self.intercept,
        }


def _design(rows: Sequence[Mapping[str, float]]) -> tuple[list[str], Any]:
    import numpy as np

    names = sorted({name for row in rows for name in row})
    matrix = np.array([[row.get(name, 0.0) for name in names] for row in rows], dtype=float).reshape(len(rows), -1)
    return names, matrix


def fit_solvability(rows: Sequence[Mapping[str, float]], targets: Sequence[float], l2: float = 1.0) -> SolvabilityModel:
    """Logistic regression of ``targets`` (shares in [0, 1]) on ``rows``; constant features are dropped.

    ``l2`` penalises the weights (not the intercept) on standardised features, which keeps
    tags seen on a handful of tasks from getting extreme weights.
    """
    import numpy as np

    names, matrix = _design(rows)
    y = np.clip(np.asarray(targets, dtype=float), 0.0, 1.0)
    mean = matrix.mean(axis=0) if len(names) else np.zeros(0)
    scale = matrix.std(axis=0) if len(names) else np.zeros(0)
    keep = scale > 1e-12
    names = [n for n, k in zip(names, keep, strict=True) if k]
    mean, scale = mean[keep], scale[keep]
    x = (matrix[:, keep] - mean) / scale if names else np.zeros((len(rows), 0))
    x = np.hstack([np.ones((len(rows), 1)), x])
    beta = np.zeros(x.shape[1])
    share = float(np.clip(y.mean(), 1e-3, 1 - 1e-3))
    beta[0] = math.log(share / (1 - share))
    penalty = np.full(x.shape[1], l2)
    penalty[0] = 0.0
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ beta, -50, 50)))
        gradient = x.T @ (p - y) + penalty * beta
        hessian = (x.T * (p * (1 - p))) @ x + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if float(np.max(np.abs(step))) < 1e-8:
            break
    return SolvabilityModel(
        tuple(names),
        tuple(float(v) for v in mean),
        tuple(float(v) for v in scale),
        tuple(float(v) for v in beta[1:]),
        float(beta[0]),
    )


def _log_loss(predicted: Sequence[float], targets: Sequence[float]) -> float:
    total = 0.0
    for raw, y in zip(predicted, targets, strict=True):
        p = min(max(raw, 1e-9), 1 - 1e-9)
        total -= y * math.log(p) + (1 - y) * math.log(1 - p)
    return total / max(len(targets), 1)


def cross_validated_gain(rows: Sequence[Mapping[str, float]], targets: Sequence[float], folds: int = 5) -> float:
    """Relative log-loss reduction of the model over the base rate, out of fold (0 or less: no signal)."""
    n = len(rows)
    if n < 2 * folds:
        return 0.0
    model_loss = base_loss = 0.0
    for fold in range(folds):
        held = [i for i in range(n) if i % folds == fold]
        kept = [i for i in range(n) if i % folds != fold]
        model = fit_solvability([rows[i] for i in kept], [targets[i] for i in kept])
        base = sum(targets[i] for i in kept) / len(kept)
        held_targets = [targets[i] for i in held]
        model_loss += _log_loss([model.predict(rows[i]) for i in held], held_targets) * len(held)
        base_loss += _log_loss([base] * len(held), held_targets) * len(held)
    return 1.0 - model_loss / base_loss if base_loss > 0 else 0.0


@dataclass(repr=False)
class FeatureRouter(Allocator):
    """Predict solvability from the task's features, then run the allocator of that bin.

    ``cuts`` are ascending solvability thresholds; bin ``i`` holds predictions in
    ``[cuts[i-1], cuts[i])``, so ``routes`` has ``len(cuts) + 1`` entries (hardest first).
    A source without features is treated as all-zero features.
    """

    model: SolvabilityModel
    cuts: tuple[float, ...]
    routes: tuple[Allocator, ...]

    def __post_init__(self) -> None:
        self.name = "router:features"

    def bin_of(self, features: Mapping[str, float]) -> int:
        """The route index for these features."""
        score = self.model.predict(features)
        return sum(score >= cut for cut in self.cuts)

    def describe(self) -> str:
        """Bins and routes, for reports."""
        edges = ["0", *(f"{c:.2f}" for c in self.cuts), "1"]
        return "; ".join(
            f"solvability {edges[i]}-{edges[i + 1]} -> {route.name}" for i, route in enumerate(self.routes)
        )

    def expected_latency_s(self, source: SampleSource) -> float:
        return max(route.expected_latency_s(source) for route in self.routes)

    def run(self, source: SampleSource) -> Allocation:
        features = source.features() if isinstance(source, FeatureSource) else {}
        route = self.routes[self.bin_of(features)]
        result = route.run(source)
        return Allocation(result.draw, result.verified, result.flagged, result.draws, f"{route.name}: {result.reason}")
