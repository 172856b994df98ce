"""Every bundled scenario diagnosed, and gated, on both engines: the embedded DuckDB store and ClickHouse.

One replay writes each scenario twice: into a DuckDB store as sre-agent's receiver
would, and into chdb (ClickHouse in-process) in the OTel Collector ClickHouse
exporter's own tables and row layout (``exporter_layout``, a stand-in for the
Collector, which cannot run here). ``diagnose`` and the canary then read each, the
second through :mod:`sre_agent.store.clickhouse` with no copy and no schema of
ours, and must give the same report: the same headline, estimates, findings,
scopes, evidence and verdicts (floats to 1e-9 relative; timings aside).

Opt-in with the other ClickHouse tests: ``python -m pytest -m clickhouse`` (about ten seconds a
scenario; ``pip install -e '.[test,clickhouse]'``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from exporter_layout import ExporterTables, Tee, differences

from sre_agent import diagnose
from sre_agent.analysis.selection import Selection
from sre_agent.canary.spec import CanarySpec
from sre_agent.canary.verdict import evaluate
from sre_agent.replays.outputs import StoreOutput
from sre_agent.replays.replay import replay
from sre_agent.replays.scenario import list_scenarios, load_scenario
from sre_agent.store.embedded import Store

SCENARIOS = list_scenarios()


#: Every other scenario's exporter table also keeps the canonical columns as materialized columns
#: (clickhouse_schema.acceleration_ddl): the answers must not depend on it.
ACCELERATED = frozenset(p.stem for p in SCENARIOS[1::2])


@pytest.mark.clickhouse
@pytest.mark.parametrize(
    "path", SCENARIOS, ids=[p.stem + ("+accelerated" if p.stem in ACCELERATED else "") for p in SCENARIOS]
)
def test_both_engines_give_the_same_report_and_verdict(path: Path, tmp_path: Path) -> None:
    from chdb import session

    from sre_agent.store.clickhouse import connect_clickhouse
    from sre_agent.store.clickhouse_schema import acceleration_ddl

    db = tmp_path / "store.duckdb"
    exported = session.Session(str(tmp_path / "clickhouse"))
    try:
        replay(load_scenario(path), Tee(StoreOutput.open(db), ExporterTables(exported, tmp_path)))
        if path.stem in ACCELERATED:
            for statement in acceleration_ddl():
                exported.query(
                    statement + (" SETTINGS mutations_sync = 1" if "MATERIALIZE COLUMN" in statement else "")
                )
    finally:
        exported.close()
    selection = Selection(mode="since_last_deploy")
    spec = CanarySpec.from_strings(["ttft_p99=2s", "error_rate=1%"], ["e2e_p99=20%", "tpot_p99=20%"], findings=0)
    house = connect_clickhouse(f"chdb:{tmp_path / 'clickhouse'}")
    try:
        assert bool(house.accelerated) == (path.stem in ACCELERATED)
        on_clickhouse = diagnose(house, selection)
        gate_clickhouse = evaluate(house, selection, spec)
    finally:
        house.close()
    on_duckdb = diagnose(db, selection)
    with Store.open(db, read_only=True) as store:
        gate_duckdb = evaluate(store.connection, selection, spec)

    assert on_clickhouse.errors == on_duckdb.errors == []
    assert differences(on_duckdb.to_dict(), on_clickhouse.to_dict()) == []
    assert differences(gate_duckdb.to_dict(), gate_clickhouse.to_dict()) == []
    # The report is about something: the scenario's own expectation holds on ClickHouse too.
    expected = load_scenario(path).expected
    assert on_clickhouse.findings[0].cause == expected.cause


@pytest.mark.clickhouse
def test_the_cli_reads_the_exporter_tables_with_store(tmp_path: Path) -> None:
    """``--store chdb:PATH`` end to end, as a user runs it: the same JSON and exit code as ``--db``."""
    from chdb import session

    db = tmp_path / "store.duckdb"
    exported = session.Session(str(tmp_path / "clickhouse"))
    try:
        scenario = load_scenario(next(p for p in SCENARIOS if p.stem == "decode_slowdown_one_host"))
        replay(scenario, Tee(StoreOutput.open(db), ExporterTables(exported, tmp_path)))
    finally:
        exported.close()

    def run(*args: str) -> tuple[int, str]:
        done = subprocess.run(
            [sys.executable, "-m", "sre_agent", *args], capture_output=True, text=True, timeout=300, check=False
        )
        return done.returncode, done.stdout

    store = f"chdb:{tmp_path / 'clickhouse'}"
    diagnose_args = ("diagnose", "--since-last-deploy", "--format", "json")
    canary_args = ("canary", "--since-last-deploy", "--slo", "tpot_p99=50ms", "--max-regression", "e2e_p99=20%",
                   "--findings", "0", "--format", "json")  # fmt: skip
    (rc_house, house), (rc_duck, duck) = run(*diagnose_args, "--store", store), run(*diagnose_args, "--db", str(db))
    assert rc_house == rc_duck == 0
    assert differences(json.loads(duck), json.loads(house)) == []
    assert json.loads(house)["findings"][0]["cause"] == "decode_slowdown"
    (rc_house, house), (rc_duck, duck) = run(*canary_args, "--store", store), run(*canary_args, "--db", str(db))
    assert rc_house == rc_duck  # the exit code is the verdict (CONTRACTS: 0 pass, 1 fail, ...)
    assert differences(json.loads(duck), json.loads(house)) == []
    # A store URL nobody can read is a clear one-line error, not a traceback.
    rc, _ = run("diagnose", "--store", "bogus://x")
    assert rc == 2


SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"


@pytest.mark.clickhouse
@pytest.mark.slow
def test_a_retry_storm_that_failed_every_request_reads_alike_on_both_engines(tmp_path: Path) -> None:
    """A generated incident (seed 1340103): a gateway retrying after 0.7 s, every request failing.

    ClickHouse returns a boolean aggregate as UInt8; the retry rule's ``failed & retried`` raised
    on it, so chdb lost the retry finding that DuckDB led with.
    """
    from chdb import session

    from sre_agent.replays.incidents import ShapedOutput, generate
    from sre_agent.replays.replay import epoch_ns
    from sre_agent.store.clickhouse import connect_clickhouse

    incident = generate(1340103, SHARED_TRACES, max_per_side=1200)
    assert incident.truth.cause == "retry_amplification"
    db = tmp_path / "store.duckdb"
    exported = session.Session(str(tmp_path / "clickhouse"))
    try:
        replay(
            incident.scenario,
            ShapedOutput(Tee(StoreOutput.open(db), ExporterTables(exported, tmp_path)), incident.shape),
        )
    finally:
        exported.close()
    deploy = epoch_ns(incident.scenario) + int(incident.scenario.deploy.at_s * 1e9)
    selection = Selection(mode="deploy_at", deploy_at_ns=deploy)
    house = connect_clickhouse(f"chdb:{tmp_path / 'clickhouse'}")
    try:
        on_clickhouse = diagnose(house, selection)
    finally:
        house.close()
    on_duckdb = diagnose(db, selection)
    assert on_clickhouse.errors == on_duckdb.errors == []
    assert on_duckdb.findings[0].cause == "retry_amplification"
    assert differences(on_duckdb.to_dict(), on_clickhouse.to_dict()) == []
