"""Per-replica counters and histograms with vLLM's names, buckets and semantics.

These mirror what a vLLM V1 engine exposes on ``/metrics``
(``vllm/v1/metrics/loggers.py``): counters are cumulative from engine start,
histograms are cumulative explicit-bucket histograms. The telemetry module
turns a snapshot into OTLP points.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

__all__ = [
    "E2E_BUCKETS",
    "ITERATION_TOKENS_BUCKETS",
    "ITL_BUCKETS",
    "TTFT_BUCKETS",
    "Histogram",
    "ReplicaStats",
]

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
)  # fmt: skip


class Histogram:
    """Cumulative explicit-bucket histogram (Prometheus ``le`` semantics: a value equal to a bound counts in it)."""

    __slots__ = ("bounds", "count", "counts", "max", "min", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0
        # smallest and largest observation (0.0 while empty)
        self.min = 0.0
        self.max = 0.0

    def observe(self, value: float, weight: int = 1) -> None:
        """Record ``value`` ``weight`` times."""
        self.counts[bisect_left(self.bounds, value)] += weight
        if self.count == 0 or value < self.min:
            self.min = value
        self.max = max(self.max, value)
        self.count += weight
        self.sum += value * weight

    def observe_ramp(self, first: float, step: float, n: int, weight: int) -> None:
        """Record the ``n`` values ``first + step * i`` (i = 0..n-1), each ``weight`` times.

        A run of identical decode steps has durations growing by a constant
        (the context read grows by one token per sequence per step); when the
        whole ramp falls in one bucket it costs O(1).
        """
        last = first + step * (n - 1)
        lo = bisect_left(self.bounds, first)
        if lo == bisect_left(self.bounds, last):
            self.counts[lo] += n * weight
        else:
            for i in range(n):
                self.counts[bisect_left(self.bounds, first + step * i)] += weight
        low, high = min(first, last), max(first, last)
        if self.count == 0 or low < self.min:
            self.min = low
        self.max = max(self.max, high)
        self.count += n * weight
        self.sum += weight * (n * first + step * n * (n - 1) / 2)

    def quantile(self, q: float) -> float:
        """Prometheus ``histogram_quantile``: linear interpolation inside the bucket (NaN when empty)."""
        if self.count == 0:
            return float("nan")
        rank = q * self.count
        seen = 0
        for i, c in enumerate(self.counts):
            if seen + c >= rank and c > 0:
                if i == len(self.bounds):
                    return self.bounds[-1]
                lo = self.bounds[i - 1] if i > 0 else 0.0
                return lo + (self.bounds[i] - lo) * (rank - seen) / c
            seen += c
        return self.bounds[-1]

    def copy(self) -> Histogram:
        """An independent copy (for snapshots)."""
        h = Histogram(self.bounds)
        h.counts = list(self.counts)
        h.count = self.count
        h.sum = self.sum
        h.min = self.min
        h.max = self.max
        return h


@dataclass
class ReplicaStats:
    """Cumulative engine statistics of one replica (vLLM V1 semantics).

    Attributes:
        prompt_tokens: ``vllm:prompt_tokens`` - prompt length of each request
            at its first token, cached tokens included.
        prefill_tokens_computed: prompt (and recomputed) tokens actually run
            through the model; not a vLLM metric, kept for fidelity tests.
        prefix_cache_queries / prefix_cache_hits: in tokens, per scheduling lookup.
        request_success: finished requests by ``finished_reason``.
        busy_s: seconds spent executing steps.
    """

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefill_tokens_computed: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_s: float = 0.0
    request_success: dict[str, int] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKENS_BUCKETS))

    def snapshot(self) -> ReplicaStats:
        """A frozen copy for a metric export."""
        return ReplicaStats(
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            prefill_tokens_computed=self.prefill_tokens_computed,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            preemptions=self.preemptions,
            steps=self.steps,
            busy_s=self.busy_s,
            request_success=dict(self.request_success),
            ttft=self.ttft.copy(),
            itl=self.itl.copy(),
            e2e=self.e2e.copy(),
            queue=self.queue.copy(),
            iteration_tokens=self.iteration_tokens.copy(),
        )
