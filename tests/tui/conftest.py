"""Fixtures for the console tests: stores (synthetic and replayed), a real server, app helpers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tui_helpers import REPLAY_SCALE, REPLAY_SCENARIO, FixtureReportSource
from tui_synth import build_store

# The console's remote tests start `sre-agent serve` with the receiver suite's harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receiver"))
from receiver_harness import ServeProcess, start_serve

from sre_agent.tui.app import IncidentApp


@pytest.fixture(scope="session")
def synth_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic incident (20k requests, 60k spans): ``gpu-3`` loses its prefix cache at ``v2``."""
    return build_store(tmp_path_factory.mktemp("synth") / "incident.duckdb", n_requests=20_000)


@pytest.fixture(scope="session")
def quiet_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same traffic without the incident."""
    return build_store(tmp_path_factory.mktemp("quiet") / "quiet.duckdb", n_requests=6_000, incident=False)


@pytest.fixture(scope="session")
def replay_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store filled by ``sre-agent replay`` with a real incident (expected cause ``prefix_cache``)."""
    db = tmp_path_factory.mktemp("replay") / "replay.duckdb"
    subprocess.run(
        [sys.executable, "-m", "sre_agent", "replay", REPLAY_SCENARIO, "--db", str(db), "--scale", REPLAY_SCALE],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return db


@pytest.fixture(scope="session")
def uniform_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every host loses its prefix cache at ``v2``, and tenants split 50/50 at random: a regression located nowhere."""
    hosts = ("gpu-1", "gpu-2", "gpu-3", "gpu-4")
    path = tmp_path_factory.mktemp("uniform") / "uniform.duckdb"
    return build_store(path, n_requests=20_000, broken_hosts=hosts, tenants=("acme", "globex"))


@pytest.fixture
def served_synth(synth_db: Path, tmp_path: Path) -> Iterator[ServeProcess]:
    """A server owning a private copy of the synthetic store (serve opens it for writing)."""
    db = tmp_path / "served.duckdb"
    db.write_bytes(synth_db.read_bytes())
    server = start_serve(db, grpc=False)
    try:
        yield server
    finally:
        server.stop()


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def synth_report() -> dict[str, Any]:
    """The diagnose engine's report on the synthetic incident, stored as a CONTRACTS-3 JSON fixture."""
    report: dict[str, Any] = json.loads((FIXTURES / "synth_report.json").read_text(encoding="utf-8"))
    return report


@pytest.fixture
def make_app(synth_db: Path, synth_report: dict[str, Any], tmp_path: Path) -> Callable[..., IncidentApp]:
    """``make_app(db=None, report=..., light=False, **kwargs)`` -> an IncidentApp over a real store."""

    def make(db: Path | None = None, report: Any = synth_report, light: bool = False, **kwargs: Any) -> IncidentApp:
        source = FixtureReportSource(str(db or synth_db), report)
        app = IncidentApp(source, export_dir=tmp_path, **kwargs)
        if light:
            app.theme = "textual-light"
        return app

    return make
