"""Error rates of the canary gate on replayed scenario pairs, under repeated polling.

Run: ``python tests/canary/canary_error_rates.py [--trials 400] [--seeds 3]``
(prints a Markdown table; the slow test ``test_canary_error_rates.py`` runs it
smaller and asserts the bounds).

Method
------
1. Replay scenario pairs with the engine simulator (``sre_agent.replays``),
   several seeds each: ``none_version_bump`` (a version bump with no change)
   and ``decode_slowdown_kernel`` (every decode step 60 % slower). Each
   replay yields per-request latencies in arrival order for the baseline
   (before the deploy) and the candidate (after) windows.
2. The SLO is set from the replays so that the regressed candidate's true
   ``tpot_p99`` exceeds it by 20 %: ``threshold = p99(regressed) / 1.2``.
   The unchanged candidate then meets it with room to spare; a third pair,
   "none at the boundary", sets the threshold *exactly* at the unchanged
   candidate's p99, the hardest case for false fails.
3. Each trial draws a canary of ``n`` requests per side from the replayed
   populations by a moving-block bootstrap (blocks of 50 consecutive
   requests), which keeps the within-batch correlation of real serving,
   and polls the gate as the canary grows: once at ``n`` (1 poll), or at
   ``n/10, 2n/10, ..., n`` (10 polls, both sides growing, as a controller
   polling every minute sees it).
4. A false fail is *any* poll answering ``fail`` on a pair whose true
   value meets the check; a false pass is *any* poll answering ``pass``
   on a pair whose true value misses it (Argo with ``failureLimit: 0`` and
   ``consecutiveSuccessLimit: 1`` acts on the first such answer).
   "Truth" is the pooled replayed population's quantile.

A naive gate (a fixed-n 95 % interval at every poll, same decision rule) is
run on the same draws for contrast.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from sre_agent.canary import QuantileEstimate, SideStats, judge, stream_quantile_estimate
from sre_agent.canary_spec import CanarySpec
from sre_agent.sequential import point_rank

BLOCK = 50
TRAFFIC = (100, 1000, 10_000)
SCHEDULES = (1, 10)
EXCEEDS = 1.2  # the regressed candidate's true p99 is 20 % above the SLO


@dataclass(frozen=True)
class Population:
    """Per-request TPOT (seconds) in arrival order, one array per replay seed."""

    runs: tuple[np.ndarray, ...]

    @property
    def pooled(self) -> np.ndarray:
        return np.concatenate(self.runs)

    def p99(self) -> float:
        values = np.sort(self.pooled)
        return float(values[point_rank(len(values), 0.99) - 1])

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` requests by moving blocks of consecutive requests from random runs."""
        parts: list[np.ndarray] = []
        have = 0
        while have < n:
            run = self.runs[rng.integers(len(self.runs))]
            start = rng.integers(0, max(1, len(run) - BLOCK))
            block = run[start : start + BLOCK]
            parts.append(block)
            have += len(block)
        return np.concatenate(parts)[:n]


def replay_populations(scenario: str, seeds: int) -> tuple[Population, Population]:
    """(baseline, candidate) TPOT populations of a scenario over ``seeds`` replays."""
    from sre_agent.replays.replay import run_scenario
    from sre_agent.replays.scenario import list_scenarios, load_scenario

    (path,) = [p for p in list_scenarios() if p.stem == scenario]
    base = load_scenario(path)
    sides: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    for k in range(seeds):
        result = run_scenario(dataclasses.replace(base, seed=base.seed + 1000 * k))
        for side, (lo, hi) in zip(sides, result.windows(), strict=True):
            tpot = []
            for rec in sorted(result.records, key=lambda r: r.start_s):
                spans = rec.engine_spans
                if lo <= rec.start_s < hi and spans and spans[-1].seq is not None:
                    seq = spans[-1].seq
                    if seq.generated > 1:
                        tpot.append((seq.last_token_s - seq.first_token_s) / (seq.generated - 1))
            side.append(np.asarray(tpot))
    return Population(tuple(sides[0])), Population(tuple(sides[1]))


def _naive(values: np.ndarray) -> QuantileEstimate:
    """A fixed-n 95 % interval for p99 (normal approximation to the binomial ranks)."""
    s = np.sort(values)
    n, p = len(s), 0.99
    half = 1.96 * math.sqrt(n * p * (1 - p))
    lower, upper = math.floor(n * p - half), math.ceil(n * p + half) + 1
    return QuantileEstimate(
        n,
        float(s[point_rank(n, p) - 1]),
        float(s[lower - 1]) if lower >= 1 else 0.0,
        float(s[upper - 1]) if upper <= n else math.inf,
    )


def _estimate(values: np.ndarray, alpha: float, naive: bool) -> QuantileEstimate:
    # The gate's own rule (confidence sequence with the design effect estimated over time slices).
    return _naive(values) if naive else stream_quantile_estimate(values.tolist(), 0.99, alpha)


def poll_verdicts(spec: CanarySpec, base: np.ndarray, cand: np.ndarray, polls: int, naive: bool = False) -> list[str]:
    """The verdict at each poll of a canary growing to ``len(cand)`` requests per side."""
    out = []
    for k in range(1, polls + 1):
        nb, nc = len(base) * k // polls, len(cand) * k // polls
        quantiles_b, quantiles_c = {}, {}
        for need in spec.quantile_needs():
            data, into = (base[:nb], quantiles_b) if need.side == "baseline" else (cand[:nc], quantiles_c)
            into[need.key] = _estimate(data, need.alpha, naive)
        verdict = judge(
            spec, SideStats(requests=nb, quantiles=quantiles_b), SideStats(requests=nc, quantiles=quantiles_c)
        )
        out.append(verdict.verdict)
    return out


@dataclass
class Cell:
    """Counts over trials for one (pair, check, traffic, schedule)."""

    trials: int = 0
    any_fail: int = 0
    any_pass: int = 0
    naive_any_fail: int = 0
    naive_any_pass: int = 0
    final_inconclusive: int = 0

    def rate(self, count: int) -> float:
        return count / self.trials if self.trials else float("nan")


def run_table(
    trials: int, seeds: int, seed: int = 0, out: object = sys.stdout
) -> dict[tuple[str, str, int, int], Cell]:
    """Measure every cell; prints progress to stderr and returns the cells."""
    started = time.perf_counter()
    none_b, none_c = replay_populations("none_version_bump", seeds)
    reg_b, reg_c = replay_populations("decode_slowdown_kernel", seeds)
    threshold = reg_c.p99() / EXCEEDS
    boundary = none_c.p99()
    print(
        f"replayed {seeds} seeds per scenario in {time.perf_counter() - started:.0f} s; "
        f"tpot_p99 none {none_b.p99() * 1000:.1f}/{none_c.p99() * 1000:.1f} ms, "
        f"regressed {reg_b.p99() * 1000:.1f}/{reg_c.p99() * 1000:.1f} ms; SLO {threshold * 1000:.1f} ms",
        file=sys.stderr,
    )
    ratio_reg = reg_c.p99() / reg_b.p99()
    max_increase = ratio_reg / EXCEEDS - 1  # the regression exceeds the allowed ratio by 20 %
    pairs = {
        "none": (none_b, none_c),
        "none at the boundary": (none_b, none_c),
        "regressed (+20% over SLO)": (reg_b, reg_c),
    }
    checks = {
        "absolute": lambda pair: CanarySpec.from_strings(
            [f"tpot_p99={(boundary if pair == 'none at the boundary' else threshold) * 1000:.4f}ms"], findings=0
        ),
        "relative": lambda pair: CanarySpec.from_strings([], [f"tpot_p99={max_increase * 100:.2f}%"], findings=0),
    }
    rng = np.random.default_rng(seed)
    cells: dict[tuple[str, str, int, int], Cell] = {}
    for pair, (base, cand) in pairs.items():
        for check, make in checks.items():
            if check == "relative" and pair == "none at the boundary":
                continue  # the boundary row is about the absolute SLO
            spec = make(pair)
            for n in TRAFFIC:
                for polls in SCHEDULES:
                    cell = cells.setdefault((pair, check, n, polls), Cell())
                    for _ in range(trials):
                        b, c = base.draw(rng, n), cand.draw(rng, n)
                        seq = poll_verdicts(spec, b, c, polls)
                        naive = poll_verdicts(spec, b, c, polls, naive=True)
                        cell.trials += 1
                        cell.any_fail += "fail" in seq
                        cell.any_pass += "pass" in seq
                        cell.naive_any_fail += "fail" in naive
                        cell.naive_any_pass += "pass" in naive
                        cell.final_inconclusive += seq[-1] == "inconclusive"
    print(f"measured in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return cells


def markdown(cells: dict[tuple[str, str, int, int], Cell]) -> str:
    """The README table."""
    lines = [
        "| pair | check | requests/side | polls | false fail | false pass | naive fixed-n false fail / pass "
        "| inconclusive at last poll |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (pair, check, n, polls), cell in cells.items():
        wrong_fail = pair.startswith("none")
        ff = f"{cell.rate(cell.any_fail):.1%}" if wrong_fail else "–"
        fp = f"{cell.rate(cell.any_pass):.1%}" if not wrong_fail else "–"
        naive = cell.rate(cell.naive_any_fail) if wrong_fail else cell.rate(cell.naive_any_pass)
        undecided = cell.rate(cell.final_inconclusive)
        lines.append(f"| {pair} | {check} | {n} | {polls} | {ff} | {fp} | {naive:.1%} | {undecided:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trials", type=int, default=400, help="canaries per cell (default 400)")
    parser.add_argument("--seeds", type=int, default=3, help="replays per scenario (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    cells = run_table(args.trials, args.seeds, args.seed)
    print(markdown(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
