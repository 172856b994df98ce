"""SLO syntax of the canary gate: ``--slo NAME=VALUE`` and ``--max-regression NAME=PCT``.

Names: ``METRIC_pNN`` with METRIC one of ``ttft``, ``itl``, ``tpot``, ``e2e``,
``queue`` and any quantile (``p50``, ``p95``, ``p99``, ``p99.9``, ``p999``);
values are durations (``2s``, ``80ms``, ``1.5``: seconds when bare).
``error_rate=1%`` (at most) and ``goodput=0.95`` (at least; the share of
requests that did not fail and met every latency SLO given) take fractions
or percentages. ``--max-regression ttft_p99=15%`` bounds the candidate's
quantile by 1.15 times the baseline's. See :mod:`sre_agent.canary.verdict` for
how they are judged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from sre_agent.errors import UsageError

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MIN_SAMPLES",
    "LATENCY_METRICS",
    "CanarySpec",
    "QuantileNeed",
    "RegressionSpec",
    "SloSpec",
    "parse_max_regression",
    "parse_slo",
]

#: Latency names accepted in SLOs -> what they measure.
LATENCY_METRICS: Final[dict[str, str]] = {
    "ttft": "time to first token",
    "itl": "inter-token latency (vLLM histogram, else per-request TPOT)",
    "tpot": "time per output token (per request)",
    "e2e": "end-to-end request latency",
    "queue": "time waiting in the engine queue",
}
DEFAULT_MIN_SAMPLES: Final[int] = 50
DEFAULT_ALPHA: Final[float] = 0.05

_NAME_RE = re.compile(r"^(ttft|itl|tpot|e2e|queue)_p(\d+(?:\.\d+)?)$")
_DURATION_RE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(us|µs|ms|s|m|min)?$")
_DURATION_UNITS: Final[dict[str, float]] = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0}


@dataclass(frozen=True)
class SloSpec:
    """One absolute SLO.

    Attributes:
        name: canonical name, e.g. ``ttft_p99``, ``error_rate``, ``goodput``.
        kind: ``quantile``, ``error_rate`` (at most) or ``goodput`` (at least).
        threshold: seconds for quantiles, a fraction in [0, 1] for the rates.
        metric / quantile: for quantile SLOs (``ttft``, 0.99); ``None`` otherwise.
    """

    name: str
    kind: Literal["quantile", "error_rate", "goodput"]
    threshold: float
    metric: str | None = None
    quantile: float | None = None


@dataclass(frozen=True)
class RegressionSpec:
    """A relative check: candidate quantile <= (1 + max_increase) x baseline quantile."""

    name: str
    metric: str
    quantile: float
    max_increase: float


def _quantile_name(name: str) -> tuple[str, float]:
    m = _NAME_RE.match(name)
    if not m:
        raise UsageError(
            f"unknown SLO {name!r}: use METRIC_pNN with METRIC one of {', '.join(LATENCY_METRICS)} "
            "(e.g. ttft_p99, itl_p95, tpot_p50, e2e_p99.9), error_rate or goodput"
        )
    digits = m.group(2)
    # p99 -> 0.99, p999 -> 0.999, p99.9 -> 0.999, p50 -> 0.5
    level = float(digits) / 100 if "." in digits or len(digits) <= 2 else float("0." + digits)
    if not 0 < level < 1:
        raise UsageError(f"SLO {name!r}: the quantile must be between p0 and p100")
    return m.group(1), level


def _split(text: str, flag: str) -> tuple[str, str]:
    if "=" not in text:
        raise UsageError(f"{flag} {text!r}: use NAME=VALUE")
    name, value = (part.strip() for part in text.split("=", 1))
    if not name or not value:
        raise UsageError(f"{flag} {text!r}: use NAME=VALUE")
    return name.lower(), value


def _fraction(text: str, what: str) -> float:
    """``1%`` -> 0.01, ``0.95`` -> 0.95."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"{what}: cannot read {text!r} as a fraction (use 1% or 0.01)") from None
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise UsageError(f"{what}: {text!r} is not between 0 and 1 (0% and 100%)")
    return value


def _duration_s(text: str, what: str) -> float:
    """``2s`` -> 2.0, ``80ms`` -> 0.08, a bare number is seconds."""
    m = _DURATION_RE.match(text.strip())
    if not m:
        raise UsageError(f"{what}: cannot read {text!r} as a duration (use e.g. 2s, 80ms, 1.5)")
    value = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]
    if value <= 0:
        raise UsageError(f"{what}: the threshold must be positive")
    return value


def parse_slo(text: str) -> SloSpec:
    """Parse ``--slo NAME=VALUE``; raises :class:`UsageError` with a hint on bad input.

    >>> parse_slo("itl_p99=80ms")
    SloSpec(name='itl_p99', kind='quantile', threshold=0.08, metric='itl', quantile=0.99)
    >>> parse_slo("error_rate=1%").threshold
    0.01
    """
    name, value = _split(text, "--slo")
    if name == "error_rate":
        return SloSpec(name, "error_rate", _fraction(value, f"--slo {name}"))
    if name == "goodput":
        return SloSpec(name, "goodput", _fraction(value, f"--slo {name}"))
    metric, level = _quantile_name(name)
    return SloSpec(name, "quantile", _duration_s(value, f"--slo {name}"), metric, level)


def parse_max_regression(text: str) -> RegressionSpec:
    """Parse ``--max-regression NAME=PCT`` (``ttft_p99=15%`` or ``ttft_p99=0.15``)."""
    name, value = _split(text, "--max-regression")
    metric, level = _quantile_name(name)
    try:
        increase = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise UsageError(f"--max-regression {name}: cannot read {value!r} (use 15% or 0.15)") from None
    if not increase >= 0 or math.isinf(increase):
        raise UsageError(f"--max-regression {name}: {value!r} must be a non-negative percentage")
    return RegressionSpec(name, metric, level, increase)


@dataclass(frozen=True)
class QuantileNeed:
    """One confidence sequence a check needs: ``metric`` at ``quantile`` on ``side`` at level ``alpha``."""

    key: str
    side: Literal["baseline", "candidate"]
    metric: str
    quantile: float
    alpha: float


@dataclass(frozen=True)
class CanarySpec:
    """What the gate checks, and how strictly.

    Attributes:
        slos: absolute SLOs.
        regressions: relative checks against the baseline.
        min_samples: fewest values per side a check needs before it may pass or fail.
        alpha: family error level over all checks and all polls.
        dry_run: report ``pass`` whatever the real verdict.
        findings: how many diagnosis findings to attach (0 = do not diagnose).
        findings_budget_s: longest time the diagnosis may add, seconds; the
            default keeps an HTTP answer inside Argo's 10 s timeout.
        require_equivalence: pass a check only when it is shown to hold (its
            bad share significantly below the limit) instead of Kayenta's
            "enough data and no significant regression".
    """

    slos: tuple[SloSpec, ...] = ()
    regressions: tuple[RegressionSpec, ...] = ()
    min_samples: int = DEFAULT_MIN_SAMPLES
    alpha: float = DEFAULT_ALPHA
    dry_run: bool = False
    findings: int = 3
    findings_budget_s: float = 6.0
    require_equivalence: bool = False

    def __post_init__(self) -> None:
        if not self.slos and not self.regressions:
            raise UsageError("give at least one SLO (NAME=VALUE) or maximum regression (NAME=PCT)")
        if self.min_samples < 1:
            raise UsageError("--min-samples must be at least 1")
        if not 0 < self.alpha < 1:
            raise UsageError("alpha must be between 0 and 1")
        names = [s.name for s in self.slos] + [f"{r.name} regression" for r in self.regressions]
        if len(set(names)) != len(names):
            raise UsageError(f"an SLO is given twice: {', '.join(sorted(names))}")

    @classmethod
    def from_strings(
        cls,
        slos: Iterable[str] = (),
        max_regressions: Iterable[str] = (),
        **options: Any,
    ) -> CanarySpec:
        """Build from ``--slo``/``--max-regression`` strings (each may hold several, comma-separated)."""

        def items(values: Iterable[str]) -> list[str]:
            return [part.strip() for value in values for part in value.split(",") if part.strip()]

        return cls(
            slos=tuple(parse_slo(s) for s in items(slos)),
            regressions=tuple(parse_max_regression(r) for r in items(max_regressions)),
            **options,
        )

    @property
    def check_alpha(self) -> float:
        """Error level of each check (Bonferroni over all checks)."""
        return self.alpha / (len(self.slos) + len(self.regressions))

    @property
    def latency_slos(self) -> tuple[SloSpec, ...]:
        """The absolute quantile SLOs (they define a request's goodness for ``goodput``)."""
        return tuple(s for s in self.slos if s.kind == "quantile")

    def quantile_needs(self) -> list[QuantileNeed]:
        """Every quantile the checks read, per side, keyed by check (``slo:NAME``, ``reg:NAME``)."""
        a = self.check_alpha
        needs: list[QuantileNeed] = []
        for s in self.latency_slos:
            assert s.metric is not None
            assert s.quantile is not None
            needs.append(QuantileNeed(f"slo:{s.name}", "baseline", s.metric, s.quantile, a))
            needs.append(QuantileNeed(f"slo:{s.name}", "candidate", s.metric, s.quantile, a))
        for r in self.regressions:
            needs.append(QuantileNeed(f"reg:{r.name}", "baseline", r.metric, r.quantile, a))
            needs.append(QuantileNeed(f"reg:{r.name}", "candidate", r.metric, r.quantile, a))
        return needs
