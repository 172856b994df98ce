"""Fixtures for the canary tests: a real ``sre-agent serve`` on loopback over a prepared store."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from canary_synth import Profile, version_pair_store

# The canary tests start `sre-agent serve` with the receiver suite's harness, as the other suites do.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receiver"))
from receiver_harness import ServeProcess, start_serve


@pytest.fixture(scope="session")
def regression_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v1 baseline and v2 candidate whose TTFT doubled (4000 requests each); read-only in every test."""
    path = tmp_path_factory.mktemp("canary") / "regression.duckdb"
    version_pair_store(path, n_baseline=4000, n_candidate=4000, candidate=Profile(ttft_scale=2.0), seed=5)
    return path


@pytest.fixture(scope="module")
def server(regression_store: Path) -> Iterator[ServeProcess]:
    """One real server for the module (starting one per test would dominate the run time)."""
    srv = start_serve(regression_store, grpc=False)
    try:
        yield srv
    finally:
        assert srv.stop() == 0, "".join(srv.stderr)
