"""Benchmark: power and validity of the canary gate under minute-by-minute polling, on replayed traffic.

Run: ``python tests/benchmarks/canary_power.py [--trials 200] [--seeds 8] [--sizes 500,2000,10000]``
(``--require-equivalence`` measures the stricter pass rule). The last line is
``canary_power: aa_false_fail=.. aa_pass=.. fail_1.5x=.. fail_2x=..`` at
2,000 requests per side.

Method
------
1. The engine simulator (``sre_agent.replays``) replays ``none_version_bump``
   (a deploy that changes nothing) with ``--seeds`` seeds. Each replay yields
   per-request TTFT, e2e and failure, in arrival order; requests in one
   engine batch share their fate, so slow requests come in bursts, as in
   real serving. Both sides draw from the same pooled replays, so the truth
   is known exactly: A/A has ratio 1, A/B has ratio f.
2. A trial draws a canary of ``n`` requests per side by a moving-block
   bootstrap (blocks of 50 consecutive requests, which keeps the bursts).
   * **A/A**: the candidate as drawn (no change).
   * **A/B at f x**: the candidate's p99 made ``f`` times the baseline's
     (1.2x sits exactly on the +20 % margin, so a fail there is a false fail):
     ``scaled`` multiplies every request's TTFT and e2e by ``f`` (a kernel
     or capacity regression that slows every request); ``tail`` stretches
     only the slower half (values above the median are pulled away from it
     so the p99 grows ``f`` times and the median stays).
3. The gate (``--max-regression e2e_p99=20% --max-regression ttft_p99=20%``,
   alpha 0.05, the default Kayenta-style pass rule; for the row "A/A, SLO at
   p99", absolute SLOs ``ttft_p99`` and ``e2e_p99`` set exactly at the true
   p99, where a fail is a false fail) is polled ten times as
   the canary grows, at ``n/10, 2n/10, ..., n`` requests per side: a
   controller polling every minute over a ten-minute analysis. The time
   blocks of each poll are the 20 equal slices of what it sees.
4. A/A false fail: any poll answered ``fail``. A/A pass: no poll failed and
   the last poll answered ``pass``. A/B fail: any poll answered ``fail``.

The gate runs as :func:`sre_agent.canary.verdict.summarise` + :func:`judge`, the pure
mirror of the store path (``tests/canary/test_canary_power.py`` checks that
the store computes the same summaries).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from sre_agent.analysis.exceedance import TIME_BLOCKS
from sre_agent.canary.spec import CanarySpec
from sre_agent.canary.verdict import judge, summarise

BLOCK = 50
POLLS = 10
FACTORS = (1.2, 1.5, 2.0)
SHAPES = ("scaled", "tail")


@dataclass(frozen=True)
class Population:
    """Per-request columns of one side, one array per replay seed, in arrival order."""

    ttft: tuple[np.ndarray, ...]
    e2e: tuple[np.ndarray, ...]
    failed: tuple[np.ndarray, ...]

    def draw(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        """``n`` requests by moving blocks of consecutive requests from random runs."""
        parts: list[tuple[int, int, int]] = []
        have = 0
        while have < n:
            run = int(rng.integers(len(self.ttft)))
            start = int(rng.integers(0, max(1, len(self.ttft[run]) - BLOCK)))
            stop = min(start + BLOCK, len(self.ttft[run]))
            parts.append((run, start, stop))
            have += stop - start

        def take(columns: tuple[np.ndarray, ...]) -> np.ndarray:
            return np.concatenate([columns[r][a:b] for r, a, b in parts])[:n]

        return {"ttft": take(self.ttft), "e2e": take(self.e2e), "failed": take(self.failed)}


def replay_population(seeds: int) -> Population:
    """Both windows of ``none_version_bump`` over ``seeds`` replays, each window one run."""
    from sre_agent.replays.replay import run_scenario
    from sre_agent.replays.scenario import list_scenarios, load_scenario

    (path,) = [p for p in list_scenarios() if p.stem == "none_version_bump"]
    base = load_scenario(path)
    sides: tuple[dict[str, list[np.ndarray]], dict[str, list[np.ndarray]]] = (
        {"ttft": [], "e2e": [], "failed": []},
        {"ttft": [], "e2e": [], "failed": []},
    )
    for k in range(seeds):
        result = run_scenario(dataclasses.replace(base, seed=base.seed + 1000 * k))
        records = sorted(result.records, key=lambda r: r.start_s)
        for side, (lo, hi) in zip(sides, result.windows(), strict=True):
            ttft, e2e, failed = [], [], []
            for rec in records:
                if not lo <= rec.start_s < hi or not rec.engine_spans:
                    continue
                span = rec.engine_spans[-1]
                seq = span.seq
                ttft.append(seq.first_token_s - span.start_s if seq is not None else np.nan)
                e2e.append(rec.end_s - rec.start_s)
                failed.append(rec.status != "ok" or span.status != "ok")
            side["ttft"].append(np.asarray(ttft, dtype=np.float64))
            side["e2e"].append(np.asarray(e2e, dtype=np.float64))
            side["failed"].append(np.asarray(failed, dtype=bool))
    runs = {k: tuple(sides[0][k] + sides[1][k]) for k in ("ttft", "e2e", "failed")}
    return Population(runs["ttft"], runs["e2e"], runs["failed"])


def regress(columns: dict[str, np.ndarray], factor: float, shape: str, reference: dict[str, float]) -> None:
    """Make the candidate's p99 ``factor`` x (in place): ``scaled`` every request, or only the ``tail``."""
    for metric in ("ttft", "e2e"):
        values = columns[metric]
        if shape == "scaled":
            columns[metric] = values * factor
            continue
        median, p99 = reference[f"{metric}_p50"], reference[f"{metric}_p99"]
        stretch = (factor * p99 - median) / (p99 - median)
        columns[metric] = np.where(values > median, median + (values - median) * stretch, values)


def poll(spec: CanarySpec, base: dict[str, np.ndarray], cand: dict[str, np.ndarray]) -> list[str]:
    """The verdict at each of :data:`POLLS` polls of a canary growing to the arrays' length."""
    out = []
    n = len(cand["e2e"])
    for k in range(1, POLLS + 1):
        m = n * k // POLLS
        blocks = np.minimum(TIME_BLOCKS - 1, np.arange(m) * TIME_BLOCKS // max(m, 1))
        b = summarise(spec, {"ttft": base["ttft"][:m], "e2e": base["e2e"][:m]}, base["failed"][:m], blocks)
        c = summarise(spec, {"ttft": cand["ttft"][:m], "e2e": cand["e2e"][:m]}, cand["failed"][:m], blocks)
        out.append(judge(spec, b, c).verdict)
    return out


@dataclass
class Cell:
    """Counts over trials for one (case, size)."""

    trials: int = 0
    any_fail: int = 0
    final_pass: int = 0
    final_decided: int = 0
    first_fail_poll: list[int] = field(default_factory=list)

    def rate(self, count: int) -> float:
        return count / self.trials if self.trials else float("nan")


def run(trials: int, seeds: int, sizes: list[int], seed: int, equivalence: bool) -> dict[tuple[str, int], Cell]:
    """Measure every (case, size) cell; progress on stderr."""
    started = time.perf_counter()
    population = replay_population(seeds)
    pooled = {m: np.concatenate(getattr(population, m)) for m in ("ttft", "e2e")}
    reference = {}
    for m, values in pooled.items():
        valid = values[~np.isnan(values)]
        reference[f"{m}_p50"], reference[f"{m}_p99"] = float(np.quantile(valid, 0.5)), float(np.quantile(valid, 0.99))
    print(
        f"replayed {seeds} seeds in {time.perf_counter() - started:.0f} s: "
        f"{sum(len(a) for a in population.e2e)} requests; ttft p99 {reference['ttft_p99']:.3f} s, "
        f"e2e p99 {reference['e2e_p99']:.2f} s",
        file=sys.stderr,
    )
    spec = CanarySpec.from_strings([], ["e2e_p99=20%", "ttft_p99=20%"], findings=0, require_equivalence=equivalence)
    # Absolute SLOs set exactly at the true p99: the hardest case for false fails of an absolute check.
    at_slo = CanarySpec.from_strings(
        [f"ttft_p99={reference['ttft_p99']!r}s", f"e2e_p99={reference['e2e_p99']!r}s"],
        findings=0,
        require_equivalence=equivalence,
    )
    cases = ["A/A", "A/A, SLO at p99"] + [f"{shape} {f:g}x" for shape in SHAPES for f in FACTORS]
    rng = np.random.default_rng(seed)
    cells: dict[tuple[str, int], Cell] = {}
    for n in sizes:
        for case in cases:
            cell = cells.setdefault((case, n), Cell())
            for _ in range(trials):
                base, cand = population.draw(rng, n), population.draw(rng, n)
                if not case.startswith("A/A"):
                    shape, factor = case.split()
                    regress(cand, float(factor[:-1]), shape, reference)
                verdicts = poll(at_slo if case == "A/A, SLO at p99" else spec, base, cand)
                cell.trials += 1
                if "fail" in verdicts:
                    cell.any_fail += 1
                    cell.first_fail_poll.append(verdicts.index("fail") + 1)
                cell.final_pass += "fail" not in verdicts and verdicts[-1] == "pass"
                cell.final_decided += verdicts[-1] != "inconclusive" or "fail" in verdicts
            print(f"  n={n} {case}: fail {cell.rate(cell.any_fail):.3f}, pass {cell.rate(cell.final_pass):.3f} "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)  # fmt: skip
    return cells


def markdown(cells: dict[tuple[str, int], Cell]) -> str:
    """The README table: per size and case, fail and pass shares and the mean poll of the first fail."""
    lines = [
        "| requests/side | case | failed (any poll) | passed (last poll) | decided | mean poll of first fail |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for (case, n), cell in cells.items():
        first = f"{np.mean(cell.first_fail_poll):.1f}" if cell.first_fail_poll else "–"
        lines.append(
            f"| {n} | {case} | {cell.rate(cell.any_fail):.3f} | {cell.rate(cell.final_pass):.3f} "
            f"| {cell.rate(cell.final_decided):.3f} | {first} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trials", type=int, default=200, help="canaries per cell (default 200)")
    parser.add_argument("--seeds", type=int, default=8, help="replays of the scenario (default 8)")
    parser.add_argument("--sizes", default="500,2000,10000", help="requests per side, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--require-equivalence", action="store_true", help="the stricter pass rule")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    cells = run(args.trials, args.seeds, sizes, args.seed, args.require_equivalence)
    print(markdown(cells))
    at = 2000 if 2000 in sizes else sizes[0]

    def share(case: str, what: str) -> str:
        cell = cells[(case, at)]
        return f"{cell.rate(cell.any_fail if what == 'fail' else cell.final_pass):.3f}"

    print(
        f"canary_power: n={at} aa_false_fail={share('A/A', 'fail')} aa_pass={share('A/A', 'pass')} "
        f"aa_slo_at_p99_false_fail={share('A/A, SLO at p99', 'fail')} "
        f"fail_1.2x={share('scaled 1.2x', 'fail')} fail_1.5x={share('scaled 1.5x', 'fail')} "
        f"fail_2x={share('scaled 2x', 'fail')} tail_fail_1.5x={share('tail 1.5x', 'fail')} "
        f"tail_fail_2x={share('tail 2x', 'fail')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
