"""Error rates on replayed scenario pairs under repeated polling (slow: replays and thousands of verdicts).

The full table is ``python tests/canary/canary_error_rates.py``; this runs it smaller and holds
the gate to the issue's bounds.
"""

from __future__ import annotations

import pytest
from canary_error_rates import run_table

TRIALS = 150


@pytest.mark.slow
def test_false_fail_and_false_pass_rates_on_replayed_pairs() -> None:
    cells = run_table(TRIALS, seeds=2, seed=3)
    for (pair, check, n, polls), cell in cells.items():
        if pair == "none":
            # a candidate that meets its SLOs, polled up to 10 times as it grows
            assert cell.rate(cell.any_fail) <= 0.05, (pair, check, n, polls)
        if pair.startswith("regressed") and n >= 1000:
            # a candidate 20 % beyond its SLO at adequate traffic is never waved through
            assert cell.rate(cell.any_pass) <= 0.05, (pair, check, n, polls)
            if check == "absolute":
                assert cell.rate(cell.any_fail) >= 0.95, (pair, check, n, polls)  # and it is caught
        if pair.startswith("none") and n == 100:
            # too little traffic for a p99: never a pass
            assert cell.rate(cell.any_pass) == 0.0, (pair, check, n, polls)
