"""The HTTP forms driven the way Argo Rollouts and Flagger drive them, against a real `sre-agent serve`.

Argo Rollouts ``web`` provider: GET (or POST with ``jsonBody``), ``timeoutSeconds``
10 by default; the JSON body (or its ``jsonPath`` selection) becomes ``result``;
any non-2xx is an *Error*, not a failure. Flagger webhooks: POST
``{name, namespace, phase, checksum, metadata}``; 200-202 advances, anything
else halts.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from receiver_harness import ServeProcess, start_serve

from sre_agent.api.canary_routes import EvaluationStore
from sre_agent.canary.verdict import Verdict
from sre_agent.cli import main

ARGO_TIMEOUT_S = 10.0  # Argo Rollouts web metric default timeoutSeconds
VERSIONS = {"baseline_version": "v1", "candidate_version": "v2"}


def argo_measure(response: httpx.Response, json_path: str | None = None) -> str:
    """What an AnalysisRun records for one measurement with
    successCondition ``result.verdict == "pass"`` and failureCondition ``result.verdict == "fail"``."""
    if not 200 <= response.status_code < 300:
        return "Error"
    body = response.json()
    result: Any = body if json_path is None else body[json_path.removeprefix("{$.").removesuffix("}")]
    verdict = result if json_path is not None else result["verdict"]
    return {"pass": "Successful", "fail": "Failed"}.get(verdict, "Inconclusive")


def flagger_advances(response: httpx.Response) -> bool:
    """Flagger: a 200-202 answer advances the canary; anything else halts it (a failed check)."""
    return 200 <= response.status_code <= 202


@pytest.fixture
def client() -> httpx.Client:
    with httpx.Client(timeout=ARGO_TIMEOUT_S) as c:
        yield c


def test_argo_get_fail_pass_and_inconclusive_are_all_2xx(server: ServeProcess, client: httpx.Client) -> None:
    url = f"{server.url}/api/v1/canary"
    failed = client.get(url, params={**VERSIONS, "slo": "ttft_p99=3s,error_rate=1%"})
    assert failed.status_code == 200
    assert failed.headers["content-type"].startswith("application/json")
    assert argo_measure(failed) == "Failed"
    assert argo_measure(failed, "{$.verdict}") == "Failed"
    body = failed.json()
    assert body["schema"] == "sre-agent/canary/v1"
    assert any(r.startswith("ttft_p99: ") and "the SLO is missed" in r for r in body["reasons"])
    # The findings explain the fail; on a heavily loaded machine the diagnosis may exceed its 6 s budget,
    # and then the verdict must still arrive in time, saying so.
    if body["findings"]:
        assert {"cause", "scope", "evidence"} <= set(body["findings"][0])
    else:
        assert any("diagnosis did not finish" in n for n in body["notes"])

    passed = client.get(url, params=[("baseline_version", "v1"), ("candidate_version", "v2"), ("slo", "ttft_p99=60s"),
                                     ("slo", "error_rate=2%")])  # fmt: skip
    assert argo_measure(passed) == "Successful", passed.json()["reasons"]
    assert passed.json()["score"] == 100

    too_little = client.get(url, params={**VERSIONS, "slo": "ttft_p99=3s", "min_samples": "100000"})
    assert too_little.status_code == 200
    assert argo_measure(too_little) == "Inconclusive"


def test_could_not_evaluate_is_an_error_for_argo_and_flagger(server: ServeProcess, client: httpx.Client) -> None:
    """An unknown version or service is 422: an Argo Error (consecutiveErrorLimit), never a verdict to poll."""
    unknown_version = {"baseline_version": "v1", "candidate_version": "v9", "slo": "ttft_p99=3s"}
    argo = client.get(f"{server.url}/api/v1/canary", params=unknown_version)
    assert argo.status_code == 422
    assert argo_measure(argo) == "Error"
    assert "cannot evaluate" in argo.json()["error"]
    assert "versions present: v1, v2" in argo.json()["error"]
    unknown_service = client.get(f"{server.url}/api/v1/canary", params={**VERSIONS, "service": "nope",
                                                                         "slo": "ttft_p99=3s"})  # fmt: skip
    assert unknown_service.status_code == 422
    assert "service nope (services: vllm)" in unknown_service.json()["error"]
    flagger = client.post(f"{server.url}/api/v1/canary/webhook", json=_flagger("Progressing", unknown_version))
    assert flagger.status_code == 422
    assert not flagger_advances(flagger)
    started = client.post(f"{server.url}/api/v1/canary/evaluations", json=unknown_version)
    assert started.status_code == 202
    for _ in range(200):
        status = client.get(f"{server.url}{started.json()['href']}")
        if status.json()["state"] != "running":
            break
        time.sleep(0.05)
    assert status.status_code == 422
    assert status.json()["verdict"] == "error"


def test_argo_post_json_body_and_dry_run(server: ServeProcess, client: httpx.Client) -> None:
    body = {"selection": {"baseline_version": "v1", "candidate_version": "v2"}, "slo": ["ttft_p99=3s"], "dry_run": True}
    response = client.post(f"{server.url}/api/v1/canary", json=body)
    assert argo_measure(response) == "Successful"
    doc = response.json()
    assert doc["dry_run"] is True
    assert doc["real_verdict"] == "fail"
    assert "dry run: the real verdict is fail" in doc["reasons"][0]


def test_argo_genuine_errors_are_non_2xx(server: ServeProcess, client: httpx.Client) -> None:
    url = f"{server.url}/api/v1/canary"
    bad = client.get(url, params={**VERSIONS, "slo": "ttft_p99=fast"})
    assert bad.status_code == 400
    assert "duration" in bad.json()["error"]
    assert argo_measure(bad) == "Error"
    assert client.get(url, params=VERSIONS).status_code == 400  # no SLO at all
    assert client.post(url, content=b"{not json", headers={"content-type": "application/json"}).status_code == 400


def _flagger(phase: str, metadata: dict[str, str]) -> dict[str, Any]:
    return {"name": "llm-gateway", "namespace": "serving", "phase": phase, "checksum": "6c3a0f", "metadata": metadata}


def test_flagger_webhook_status_is_the_verdict(server: ServeProcess, client: httpx.Client) -> None:
    url = f"{server.url}/api/v1/canary/webhook"
    failing = client.post(url, json=_flagger("Progressing", {**VERSIONS, "slo": "ttft_p99=3s"}))
    assert failing.status_code == 412
    assert not flagger_advances(failing)
    assert failing.json()["verdict"] == "fail"
    assert failing.json()["canary"] == {"name": "llm-gateway", "namespace": "serving", "phase": "Progressing",
                                        "checksum": "6c3a0f"}  # fmt: skip

    passing = client.post(url, json=_flagger("Progressing", {**VERSIONS, "slo": "ttft_p99=60s"}))
    assert passing.status_code == 200
    assert flagger_advances(passing)

    waiting = client.post(url, json=_flagger("Progressing", {**VERSIONS, "slo": "ttft_p99=60s",
                                                             "min_samples": "100000"}))  # fmt: skip
    assert waiting.status_code == 412  # inconclusive halts this step; Flagger retries next interval
    assert waiting.json()["verdict"] == "inconclusive"

    dry = client.post(url, json=_flagger("Progressing", {**VERSIONS, "slo": "ttft_p99=3s", "dry_run": "true"}))
    assert flagger_advances(dry)
    assert dry.json()["real_verdict"] == "fail"

    typo = client.post(url, json=_flagger("Progressing", {**VERSIONS, "sloo": "ttft_p99=3s"}))
    assert typo.status_code == 400
    assert "unknown parameter" in typo.json()["error"]


def test_async_evaluation_202_then_poll(server: ServeProcess, client: httpx.Client) -> None:
    start = client.post(f"{server.url}/api/v1/canary/evaluations", json={**VERSIONS, "slo": "ttft_p99=3s"})
    assert start.status_code == 202
    key = start.json()["id"]
    assert start.headers["location"] == f"/api/v1/canary/evaluations/{key}"
    deadline = time.monotonic() + 20
    while True:
        status = client.get(f"{server.url}{start.headers['location']}")
        assert status.status_code == 200
        if status.json()["state"] != "running":
            break
        assert status.json()["verdict"] == "in_progress"
        assert time.monotonic() < deadline, "evaluation never finished"
        time.sleep(0.05)  # a real server computing in a worker thread: poll like a client would
    assert status.json()["state"] == "done"
    assert status.json()["verdict"] == "fail"
    assert client.get(f"{server.url}/api/v1/canary/evaluations/nope").status_code == 404
    assert client.post(f"{server.url}/api/v1/canary/evaluations", json={"slo": "bogus=1"}).status_code == 400


def test_cli_url_mode_against_the_server(server: ServeProcess, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["canary", "--url", server.url, "--baseline-version", "v1", "--candidate-version", "v2"]
    assert main([*args, "--slo", "ttft_p99=3s", "--format", "json"]) == 1
    assert '"verdict": "fail"' in capsys.readouterr().out
    assert main([*args, "--slo", "ttft_p99=60s"]) == 0
    assert main([*args, "--slo", "ttft_p99=3s", "--dry-run"]) == 0
    assert "real verdict fail" in capsys.readouterr().err


def test_evaluation_store_is_bounded_and_expires() -> None:
    now = [0.0]
    with ThreadPoolExecutor(max_workers=1) as executor:
        store = EvaluationStore(executor, max_entries=2, ttl_s=60.0, clock=lambda: now[0])
        gate: Future[None] = Future()

        def blocked() -> Verdict:
            gate.result(5)
            raise RuntimeError("not reached in this test")

        first = store.submit(blocked)
        second = store.submit(blocked)
        assert first is not None
        assert second is not None
        assert store.submit(blocked) is None  # full of running jobs: refuse rather than grow
        now[0] = 61.0
        assert store.get(first) is None  # expired
        assert len(store) == 0
        gate.set_result(None)


# The README's AnalysisTemplate URL and Flagger metadata, verbatim (args substituted as Argo would).
README_ARGO_QUERY = (
    "baseline_version={{args.stable-version}}&candidate_version={{args.canary-version}}"
    "&slo=ttft_p99=2s,itl_p99=80ms,error_rate=1%25,goodput=0.95&max_regression=ttft_p99=15%25"
)
README_FLAGGER_METADATA = {
    "slo": "ttft_p99=2s,itl_p99=80ms,error_rate=1%,goodput=0.95",
    "max_regression": "ttft_p99=15%",
    "min_samples": "200",
}


def test_readme_argo_url_and_flagger_metadata_work_verbatim(server: ServeProcess, client: httpx.Client) -> None:
    query = README_ARGO_QUERY.replace("{{args.stable-version}}", "v1").replace("{{args.canary-version}}", "v2")
    argo = client.get(f"{server.url}/api/v1/canary?{query}")
    assert argo.status_code == 200, argo.text
    doc = argo.json()
    assert [c["name"] for c in doc["slos"]] == ["ttft_p99", "itl_p99", "error_rate", "goodput", "ttft_p99 regression"]
    assert doc["slos"][2]["threshold"] == pytest.approx(0.01)
    assert argo_measure(argo) == "Failed"  # the store's candidate doubled its TTFT
    flagger = client.post(
        f"{server.url}/api/v1/canary/webhook",
        json=_flagger("Progressing", {**VERSIONS, **README_FLAGGER_METADATA}),
    )
    assert flagger.status_code == 412
    assert [c["name"] for c in flagger.json()["slos"]] == [c["name"] for c in doc["slos"]]


def test_tokens_and_tenant_scoping(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A tenant token judges only its tenant's spans; no token is a 401 (an Argo Error, not a verdict)."""
    from canary_synth import version_pair_store

    db = tmp_path_factory.mktemp("tenants") / "store.duckdb"
    version_pair_store(db, n_baseline=300, n_candidate=300, seed=1)  # spans without tenant.id
    srv = start_serve(
        db, grpc=False, env={"SRE_AGENT_TOKEN": "admin-token", "SRE_AGENT_TENANT_TOKENS": "acme-token=acme"}
    )
    try:
        url = f"{srv.url}/api/v1/canary"
        params = {**VERSIONS, "slo": "e2e_p99=600s", "findings": "0"}
        with httpx.Client(timeout=ARGO_TIMEOUT_S) as http:
            assert http.get(url, params=params).status_code == 401
            admin = http.get(url, params=params, headers={"Authorization": "Bearer admin-token"})
            assert admin.status_code == 200
            assert admin.json()["candidate"]["requests"] == 300
            acme = http.get(url, params=params, headers={"Authorization": "Bearer acme-token"})
            # acme has no spans: its versions are unknown to it, and nothing of another tenant leaks
            assert acme.status_code == 422
            assert "versions present: none" in acme.json()["error"]
    finally:
        assert srv.stop() == 0, "".join(srv.stderr)


def test_sigterm_during_an_async_evaluation_finishes_it_and_exits_0(regression_store: Path, tmp_path: Path) -> None:
    db = tmp_path / "stopping.duckdb"
    shutil.copy(regression_store, db)
    srv = start_serve(db, grpc=False)
    try:
        for _ in range(3):  # two workers: the third waits in the queue and is dropped at shutdown
            started = httpx.post(f"{srv.url}/api/v1/canary/evaluations", json={**VERSIONS, "slo": "ttft_p99=3s"})
            assert started.status_code == 202
    finally:
        code = srv.stop()
    # The read connection used to be closed under the running evaluations: DuckDB refused
    # ("connection is busy") and the shutdown was no longer clean.
    assert code == 0, srv.stderr
    assert "Traceback" not in srv.stderr
    assert "busy" not in srv.stderr
