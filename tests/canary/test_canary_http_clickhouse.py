"""``sre-agent serve --read chdb:PATH``: the API over the exporter's tables, called as Argo and Flagger call it.

One replay is written twice (a DuckDB store as ``serve`` keeps it; the ClickHouse
exporter's tables in chdb, laid out by ``exporter_layout``, a stand-in for the
Collector). Two real servers answer over real sockets, ``serve --db`` and ``serve
--read``; their canary verdicts (Argo's GET, Flagger's webhook), diagnoses, status
and tenant-scoped answers must be the same. Opt-in: ``-m clickhouse``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from exporter_layout import ExporterTables, Tee, differences
from receiver_harness import ServeProcess, start_process, start_serve

from sre_agent.replays.outputs import StoreOutput
from sre_agent.replays.replay import replay
from sre_agent.replays.scenario import list_scenarios, load_scenario

pytestmark = pytest.mark.clickhouse

ADMIN, TENANT_TOKEN = "admin-secret", "acme-read"
ENV = {"SRE_AGENT_TOKEN": ADMIN, "SRE_AGENT_TENANT_TOKENS": f"{TENANT_TOKEN}=acme"}
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}


def start_read_server(store: str) -> ServeProcess:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SRE_AGENT_")} | ENV
    command = [sys.executable, "-m", "sre_agent", "serve", "--read", store, "--http-port", "0"]
    return start_process(command, Path(store.removeprefix("chdb:")), child_env)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, ServeProcess]]:
    """(serve --db on the DuckDB store, serve --read on chdb), both holding dependency_retrieval_one_tenant."""
    from chdb import session

    root = tmp_path_factory.mktemp("read-server")
    db, house = root / "store.duckdb", root / "otel-chdb"
    exported = session.Session(str(house))
    try:
        scenario = load_scenario(next(p for p in list_scenarios() if p.stem == "dependency_retrieval_one_tenant"))
        replay(scenario, Tee(StoreOutput.open(db), ExporterTables(exported, root)))
    finally:
        exported.close()  # one process at a time may hold a chdb directory: the server opens it next
    duck = start_serve(db, env=ENV, grpc=False)
    try:
        house_server = start_read_server(f"chdb:{house}")
        try:
            yield duck, house_server
        finally:
            assert house_server.stop() == 0, house_server.stderr
    finally:
        assert duck.stop() == 0, duck.stderr


def test_argo_and_flagger_get_the_same_verdicts_from_clickhouse(servers: tuple[ServeProcess, ServeProcess]) -> None:
    duck, house = servers
    params = {"slo": "ttft_p99=2s,error_rate=1%", "max_regression": "e2e_p99=20%", "findings": "1"}
    flagger = {"name": "podinfo", "namespace": "test", "phase": "Progressing", "checksum": "x",
               "metadata": {"slo": "ttft_p99=2s", "max_regression": "e2e_p99=20%"}}  # fmt: skip
    with httpx.Client(timeout=60, headers=ADMIN_HEADERS) as client:
        answers = [client.get(f"{s.url}/api/v1/canary", params=params) for s in (duck, house)]
        assert [a.status_code for a in answers] == [200, 200]
        assert differences(answers[0].json(), answers[1].json()) == []
        verdict = answers[1].json()
        assert verdict["verdict"] in ("pass", "fail")  # decided, on data
        assert all(check["n_candidate"] > 1000 for check in verdict["slos"])
        hooks = [client.post(f"{s.url}/api/v1/canary/webhook", json=flagger) for s in (duck, house)]
        assert hooks[0].status_code == hooks[1].status_code
        assert differences(hooks[0].json(), hooks[1].json()) == []


def test_diagnose_status_and_tenant_scope_read_alike(servers: tuple[ServeProcess, ServeProcess]) -> None:
    duck, house = servers
    body = {"selection": {"mode": "since_last_deploy"}}
    with httpx.Client(timeout=120) as client:
        reports = [client.post(f"{s.url}/api/v1/diagnose", json=body, headers=ADMIN_HEADERS) for s in (duck, house)]
        assert [r.status_code for r in reports] == [200, 200]
        assert differences(reports[0].json(), reports[1].json()) == []
        assert reports[1].json()["findings"][0]["cause"] == "dependency"
        # A tenant token reads its tenant's rows only, on both: here the gateway's spans of acme (the
        # engine spans carry no tenant, so a diagnosis has no requests to compare: 422 on both).
        tenant = {"Authorization": f"Bearer {TENANT_TOKEN}"}
        scoped = [client.post(f"{s.url}/api/v1/diagnose", json=body, headers=tenant) for s in (duck, house)]
        assert scoped[0].status_code == scoped[1].status_code
        statuses = [client.get(f"{s.url}/api/v1/status", headers=tenant).json() for s in (duck, house)]
        assert differences(statuses[0], statuses[1]) == []
        status = client.get(f"{house.url}/api/v1/status", headers=ADMIN_HEADERS).json()
        assert 0 < statuses[1]["spans"] < status["spans"]
        assert status["metric_points"] > 0
        # Nothing is stored here: a deploy marker cannot be written.
        marked = client.post(
            f"{house.url}/api/v1/deploys", json={"service": "vllm", "version": "v3"}, headers=ADMIN_HEADERS
        )
        assert marked.status_code == 405
        assert "only reads ClickHouse" in marked.json()["error"]
        assert client.get(f"{house.url}/api/v1/status").status_code == 401
