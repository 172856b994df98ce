"""Benchmark: the null behind ``diagnosis.MECHANISM_CONFIDENCE`` (issue 12, the mechanism route).

A latency that rose within its noise becomes a regression when a mechanism the rules test on
its own explains it at ``MECHANISM_CONFIDENCE`` or more (``diagnosis._by_mechanism``). This
measures what that confidence reaches when nothing changed: the healthy deploys (``none``) of
the incident generator's seeds ``--seed`` .. ``--seed + --n - 1``, those the benchmark would
score (``visible``), each replayed into a store in-process (``replay_into_store``). For each,
the user-facing quantile that rose most by its point estimate (``diagnosis._provisional``) is
handed to every rule, and the most confident finding the route would take
(``diagnosis.mechanism_finding``: a mechanism tested on its own, or replicas counted fewer) is
recorded. The default range, 1900000-1900399, is one no accuracy run
reports on.

Run: ``python tests/benchmarks/mechanism_null.py [--seed 1900000] [--n 400] [--jobs 2]``.
The last line is ``mechanism_null: healthy=H headline_alarms=A provisional=P max_confidence=C
at_or_above_bar=K bar=B``.
"""

from __future__ import annotations

import argparse
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.diagnosis import (
    MECHANISM_CONFIDENCE,
    _context,
    _provisional,
    mechanism_finding,
    run_rules,
)
from sre_agent.analysis.headline import estimate_metrics, headline
from sre_agent.analysis.rules_registry import load_rules
from sre_agent.replays.incidents import generate, replay_into_store
from sre_agent.store.embedded import Store

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRACES = REPO.parent / "shared" / "data" / "traces"


def strongest_mechanism(seed: int, traces: Path | None) -> tuple[int, str, str, float] | None:
    """(seed, state, the surest mechanism's cause, its confidence); ``None`` when the benchmark would not score it.

    ``state``: ``flat`` (no user-facing quantile rose enough to test), ``risen`` (one did, and the
    rules were asked to explain it), ``headline`` (the headline itself called a regression: a false
    alarm the accuracy benchmark counts, not this route's).
    """
    incident = generate(seed, traces)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.duckdb"
        info, selection = replay_into_store(incident, db)
        if not info["visible"]:
            return None
        store = Store.open(db, read_only=True)
        try:
            comparison = Comparison.open(store.connection, selection)
            estimates = estimate_metrics(comparison)
            if headline(comparison, estimates).significant:
                # Already a false alarm of the headline itself, which the accuracy benchmark counts.
                return seed, "headline", "-", 0.0
            provisional = _provisional(estimates)
            if provisional is None:
                return seed, "flat", "-", 0.0
            loaded, _ = load_rules(None)
            findings = run_rules(loaded, _context(comparison, provisional, estimates))[0]
            surest = mechanism_finding(findings, 0.0, versions_side_by_side=comparison.windows_overlap)
            return seed, "risen", surest.cause if surest else "-", surest.confidence if surest else 0.0
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1_900_000, help="first seed (default 1900000)")
    parser.add_argument("--n", type=int, default=400, help="seeds to draw (default 400; about a fifth are healthy)")
    parser.add_argument("--jobs", type=int, default=1, help="incidents in parallel (default 1: the machine is shared)")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES if DEFAULT_TRACES.is_dir() else None)
    args = parser.parse_args()
    seeds = [s for s in range(args.seed, args.seed + args.n) if generate(s, args.traces).truth.cause == "none"]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = [r for r in pool.map(strongest_mechanism, seeds, [args.traces] * len(seeds)) if r is not None]
    for seed, state, cause, confidence in rows:
        print(f"seed {seed} {state} {cause} {confidence:.2f}")
    risen_rows = [r for r in rows if r[1] == "risen"]
    top = max((r[3] for r in risen_rows), default=0.0)
    above = sum(r[3] >= MECHANISM_CONFIDENCE for r in risen_rows)
    print(
        f"mechanism_null: healthy={len(rows)} headline_alarms={sum(r[1] == 'headline' for r in rows)} "
        f"provisional={len(risen_rows)} max_confidence={top:.2f} at_or_above_bar={above} bar={MECHANISM_CONFIDENCE}"
    )


if __name__ == "__main__":
    main()
