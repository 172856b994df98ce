"""`sre-agent ingest` as a user runs it: exit codes 0, 1 and 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from otlp_builders import VLLM_V1, otlp_json, trace_request

FIXTURES = Path(__file__).parent / "fixtures"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sre_agent", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_ingest_ok_then_duplicates_then_rejected(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(otlp_json(trace_request([{"attributes": VLLM_V1}] * 1))) + "\n")
    db = str(tmp_path / "cli.duckdb")

    first = _run("ingest", "--db", db, str(good), str(FIXTURES / "trace.json"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "good.jsonl: 1 spans (1 new, 0 duplicates)" in first.stderr
    assert first.stdout == ""

    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + "not json\n")
    second = _run("ingest", "--db", db, "--format", "json", str(bad), str(tmp_path / "missing.jsonl"), cwd=tmp_path)
    assert second.returncode == 1
    summary = json.loads(second.stdout)
    assert summary["totals"]["duplicates"] == 1
    assert summary["totals"]["inserted"] == 0
    assert summary["files"][0]["bad_lines"][0]["line"] == 2
    assert summary["files"][1]["error"] == "no such file"
    assert "missing.jsonl: not ingested: no such file" in second.stderr
    assert "line 2: invalid JSON" in second.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert _run("ingest", cwd=tmp_path).returncode == 2  # no FILE
    bad_flag = _run("ingest", "--no-such-flag", "x.jsonl", cwd=tmp_path)
    assert bad_flag.returncode == 2
    assert "unrecognized arguments" in bad_flag.stderr


def test_help_ends_with_an_example(tmp_path: Path) -> None:
    result = _run("ingest", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.rstrip().splitlines()[-1].strip().startswith("sre-agent ingest")


def test_keep_content_flag(tmp_path: Path) -> None:
    path = tmp_path / "content.jsonl"
    request = trace_request([{"attributes": {"gen_ai.input.messages": "hello there"}}])
    path.write_text(json.dumps(otlp_json(request)) + "\n")
    db = tmp_path / "content.duckdb"
    assert _run("ingest", "--db", str(db), "--keep-content", str(path), cwd=tmp_path).returncode == 0
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        value = con.execute("SELECT attributes['gen_ai.input.messages'] FROM spans").fetchone()
    assert value == ("hello there",)
