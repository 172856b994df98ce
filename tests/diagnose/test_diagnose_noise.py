"""Noise on a short window is not a regression (issue 12 item 11).

A healthy deploy, seven minutes and ~2,000 requests a side, on a stack whose
TPOT swings with the running batch (a slowly varying factor shared by every
request, correlation time one minute): TPOT/ITL p99 moves 1.2x between the
windows by chance. Block-bootstrap CIs over 10-second slices took those
swings for independent evidence and reported ``decode_slowdown`` in about one
deploy in four. Significance now accounts for correlation between slices and
for testing several latencies at once; a real 1.3x decode slowdown under the
same noise is still found.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import Options, Side, build_store

from sre_agent.analysis.diagnosis import diagnose
from sre_agent.analysis.selection import Selection

#: ~2,000 requests a side in 7 minutes; TPOT carries a one-minute, +-12 % swing.
NOISY = {"rate_rps": 4.8, "duration_s": 420.0, "replicas": 2, "tpot_drift": 0.12, "tpot_drift_s": 60.0}


def _diagnose(tmp_path: Path, seed: int, slowdown: float = 1.0) -> str:
    path = tmp_path / f"noise{seed}-{slowdown}.duckdb"
    candidate = Side(version="v2", **{**NOISY, "tpot_s": 0.02 * slowdown})  # type: ignore[arg-type]
    deploy = build_store(path, Side(**NOISY), candidate, Options(seed=seed))  # type: ignore[arg-type]
    report = diagnose(path, Selection(mode="deploy_at", deploy_at_ns=deploy))
    return report.findings[0].cause if report.findings else "unexplained"


def test_healthy_deploys_with_time_correlated_tpot_are_not_regressions(tmp_path: Path) -> None:
    causes = [_diagnose(tmp_path, seed) for seed in range(1, 13)]
    # One-sided family-wise 2.5 %: over 12 healthy deploys, at most one may be flagged (the old
    # statistics flagged 3 of these 12, and 8 of 30 over seeds 1..30).
    assert sum(c != "none" for c in causes) <= 1, causes


@pytest.mark.slow
def test_a_real_decode_slowdown_under_the_same_noise_is_found(tmp_path: Path) -> None:
    causes = [_diagnose(tmp_path, seed, slowdown=1.3) for seed in range(1, 9)]
    assert sum(c == "decode_slowdown" for c in causes) >= 5, causes
