"""``sre-agent diagnose`` and ``sre-agent rules``: exit codes, formats, and --url through a real server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sre_agent.cli import main

MakeStore = Callable[[str], tuple[Path, int]]


def test_diagnose_json_exit_0(make_store: MakeStore, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = make_store("load")
    assert main(["diagnose", "--db", str(path), "--since-last-deploy", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["findings"][0]["cause"] == "load"


def test_diagnose_markdown_and_text(make_store: MakeStore, capsys: pytest.CaptureFixture[str]) -> None:
    path, deploy = make_store("load")
    assert main(["diagnose", "--db", str(path), "--deploy-at", str(deploy / 1e9), "--format", "markdown"]) == 0
    assert capsys.readouterr().out.startswith("## Diagnosis")
    assert main(["diagnose", "--db", str(path), "--since-last-deploy", "--rule", "queueing"]) == 0
    out = capsys.readouterr().out
    assert "1. load" in out


def test_usage_errors_exit_2(make_store: MakeStore, capsys: pytest.CaptureFixture[str]) -> None:
    path, deploy = make_store("load")
    assert main(["diagnose", "--db", str(path), "--since-last-deploy", "--deploy-at", "1"]) == 2
    assert "choose one selection" in capsys.readouterr().err
    assert main(["diagnose", "--db", str(path), "--deploy-at", "yesterday"]) == 2
    assert main(["diagnose", "--db", str(path), "--deploy-at", str(deploy / 1e9 + 10_000)]) == 2
    assert "no engine requests after the deploy" in capsys.readouterr().err
    assert main(["diagnose", "--db", str(path), "--since-last-deploy", "--format", "yaml"]) == 2


def test_help_ends_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["diagnose", "--help"])
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].strip().startswith("sre-agent diagnose")


def test_rules_command_lists_installed_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "--format", "json", "--check"]) == 0
    rows = json.loads(capsys.readouterr().out)["rules"]
    by_name = {r["name"]: r for r in rows}
    for name in ("stages", "queueing", "traffic_mix", "slices"):
        assert by_name[name]["target"] == f"sre_agent.rules.{name}:{name}"
        assert by_name[name]["error"] is None


@pytest.fixture(scope="module")
def served(make_store: MakeStore) -> Iterator[str]:
    """A real ``sre-agent serve`` over the load store; yields its base URL."""
    path, _ = make_store("load")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sre_agent", "serve", "--db", str(path), "--http-port", "0", "--grpc-port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    url = ""
    deadline = time.monotonic() + 60
    assert proc.stderr is not None
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "API on " in line:
            url = line.rsplit(" ", 1)[1].strip()
        if "ready" in line and url:
            break
    try:
        assert url, "".join(lines)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()


def test_http_endpoint_and_cli_url_mode(served: str, capsys: pytest.CaptureFixture[str]) -> None:
    answer = httpx.post(f"{served}/api/v1/diagnose", json={"selection": {"mode": "since_last_deploy"}}, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["schema"] == "sre-agent/diagnosis/v1"
    assert answer.json()["findings"][0]["cause"] == "load"
    bad = httpx.post(f"{served}/api/v1/diagnose", json={"selection": {"mode": "bogus"}}, timeout=30)
    assert bad.status_code == 400
    empty = httpx.post(f"{served}/api/v1/diagnose", json={"deploy_at": "2030-01-01T00:00:00Z"}, timeout=30)
    assert empty.status_code == 422
    assert "no engine requests" in empty.text
    assert main(["diagnose", "--url", served, "--since-last-deploy"]) == 0
    assert "1. load" in capsys.readouterr().out
