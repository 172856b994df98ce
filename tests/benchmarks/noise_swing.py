"""Benchmark: significance under a slow TPOT swing, healthy and slowed deploys (issue 12, item 11).

The synthetic stack of ``tests/diagnose/synth.py`` (``Side(rate_rps=4.8, duration_s=420,
replicas=2)``: ~2,000 requests a side in 7 minutes) with TPOT carrying a one-minute +-12 %
swing shared by every request. Each deploy is diagnosed through the library path
(``diagnose(..., Selection(mode="deploy_at"))``):

- healthy deploys with the swing (seeds 1..40): how many are flagged as anything but ``none``;
- a 1.3x decode slowdown with the swing (seeds 1..20): how many are found as ``decode_slowdown``;
- a 1.2x decode slowdown without the swing (seeds 1..20): how many are found.

``--scales`` replaces :data:`sre_agent.analysis.stats.BLOCK_SCALES` for the run (to compare block lengths).
The last line is ``noise_swing: healthy_flagged=F/40 slowed_found=S/20 plain_found=P/20 scales=..``.

Run: ``python tests/benchmarks/noise_swing.py [--scales 1,2,4,8]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnose"))

from synth import Options, Side, build_store

from sre_agent.analysis import stats
from sre_agent.analysis.diagnosis import diagnose
from sre_agent.analysis.selection import Selection

#: The item-11 stack (tests/diagnose/test_diagnose_noise.py uses the same).
NOISY = {"rate_rps": 4.8, "duration_s": 420.0, "replicas": 2, "tpot_drift": 0.12, "tpot_drift_s": 60.0}


def top_cause(root: Path, seed: int, slowdown: float, swing: bool) -> str:
    """The top finding's cause for one synthetic deploy ("unexplained" when there is none)."""
    base = dict(NOISY) if swing else {**NOISY, "tpot_drift": 0.0}
    path = root / f"swing{int(swing)}-{seed}-{slowdown}.duckdb"
    candidate = Side(version="v2", **{**base, "tpot_s": 0.02 * slowdown})  # type: ignore[arg-type]
    deploy = build_store(path, Side(**base), candidate, Options(seed=seed))  # type: ignore[arg-type]
    report = diagnose(path, Selection(mode="deploy_at", deploy_at_ns=deploy))
    return report.findings[0].cause if report.findings else "unexplained"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", default=None, help="block lengths in slices, e.g. 1,2,4 (default: the code's)")
    args = parser.parse_args()
    if args.scales:
        stats.BLOCK_SCALES = tuple(int(x) for x in args.scales.split(","))  # type: ignore[misc]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        flagged = sum(top_cause(root, seed, 1.0, swing=True) != "none" for seed in range(1, 41))
        slowed = sum(top_cause(root, seed, 1.3, swing=True) == "decode_slowdown" for seed in range(1, 21))
        plain = sum(top_cause(root, seed, 1.2, swing=False) == "decode_slowdown" for seed in range(1, 21))
    scales = ",".join(str(s) for s in stats.BLOCK_SCALES)
    print(f"noise_swing: healthy_flagged={flagged}/40 slowed_found={slowed}/20 plain_found={plain}/20 scales={scales}")


if __name__ == "__main__":
    main()
