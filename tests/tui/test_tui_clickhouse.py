"""The console on ClickHouse: the OTel Collector exporter's tables in chdb, read with ``--store chdb:PATH``.

The replayed incident of the console suite goes through a Collector file-exporter file
into two stores: ``sre-agent ingest`` (DuckDB) and the ClickHouse exporter's layout in
chdb (``exporter_layout``, standing in for the Collector). Every panel's data must be
the same from both; under Textual's pilot and in a real terminal (tmux) the console
finds the incident on ClickHouse. Opt-in: ``-m clickhouse`` (``pip install -e '.[clickhouse]'``).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from exporter_layout import differences, load_otlp_json_lines
from test_tui_tmux import start_session, tmux, wait_for
from tui_helpers import REPLAY_SCALE, REPLAY_SCENARIO, wait_until

from sre_agent.analysis.selection import Selection
from sre_agent.api.explore_routes import to_json_dict
from sre_agent.config import Config
from sre_agent.tui.app import IncidentApp
from sre_agent.tui.source import LocalSource

pytestmark = pytest.mark.clickhouse
SINCE = Selection(mode="since_last_deploy")


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(DuckDB store, chdb directory) holding the same replayed incident."""
    from chdb import session

    root = tmp_path_factory.mktemp("clickhouse-console")
    telemetry, db, house = root / "incident.jsonl.gz", root / "store.duckdb", root / "otel-chdb"
    cli = [sys.executable, "-m", "sre_agent"]
    replay = [*cli, "replay", REPLAY_SCENARIO, "--out", str(telemetry), "--scale", REPLAY_SCALE]
    subprocess.run(replay, check=True, capture_output=True, timeout=300)
    subprocess.run([*cli, "ingest", "--db", str(db), str(telemetry)], check=True, capture_output=True, timeout=300)
    exported = session.Session(str(house))
    try:
        load_otlp_json_lines(exported, telemetry, root)
    finally:
        exported.close()
    return db, house


def test_every_panel_reads_the_same_from_both_stores(both: tuple[Path, Path]) -> None:
    db, house = both
    local, remote = LocalSource(str(db)), LocalSource("", Config(store=f"chdb:{house}"))
    try:
        remote.check()
        assert remote.description == f"store chdb:{house}"
        exemplars = remote.exemplars(SINCE, "e2e")
        trace = exemplars[-1]
        for name, panel in {
            "overview": lambda s: s.overview(SINCE, {"ttft": 5.0}),
            "timeline": lambda s: s.timeline(SINCE, "ttft", 30),
            "stages": lambda s: s.stages(SINCE, "e2e"),
            "slices": lambda s: s.slices(SINCE, "e2e"),
            "exemplars": lambda s: s.exemplars(SINCE, "e2e"),
            "waterfall": lambda s: s.waterfall(trace.trace_id, trace.start_ns),
            "versions": lambda s: s.versions(None),
        }.items():
            assert differences(to_json_dict(panel(local)), to_json_dict(panel(remote))) == [], name
    finally:
        remote.close()
        local.close()


async def test_the_console_finds_the_incident_on_clickhouse(both: tuple[Path, Path], tmp_path: Path) -> None:
    _, house = both
    source = LocalSource("", Config(store=f"chdb:{house}"))
    app = IncidentApp(source, export_dir=tmp_path)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(lambda: app.report is not None or app.report_reason != "diagnosing…", 180, pilot.pause)
            assert app.report is not None, app.report_reason
            assert app.report["findings"][0]["cause"] == "prefix_cache"
    finally:
        source.close()  # one process at a time may hold a chdb directory: the tmux test opens it next


def test_the_console_in_a_real_terminal_reads_clickhouse(both: tuple[Path, Path]) -> None:
    _, house = both
    command = f"{shlex.quote(sys.executable)} -m sre_agent tui --store {shlex.quote(f'chdb:{house}')}"
    session = start_session(command)
    try:
        screen = wait_for(session, lambda text: "Why:   #1 prefix_cache" in text)
        assert "What:" in screen
        tmux("send-keys", "-t", session, "q")
    finally:
        tmux("kill-session", "-t", session)
