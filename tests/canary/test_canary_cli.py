"""`sre-agent canary` on a store file: exit codes 0 pass, 1 fail, 3 inconclusive, 2 usage, 4 could not evaluate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sre_agent.cli import main


def _canary(db: Path, *extra: str) -> list[str]:
    return ["canary", "--db", str(db), "--baseline-version", "v1", "--candidate-version", "v2", "--findings", "0",
            *extra]  # fmt: skip


def test_exit_codes(regression_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_canary(regression_store, "--slo", "ttft_p99=3s")) == 1
    assert "canary verdict: FAIL" in capsys.readouterr().out
    assert main(_canary(regression_store, "--slo", "ttft_p99=60s", "--slo", "error_rate=2%")) == 0
    assert main(_canary(regression_store, "--slo", "ttft_p99=60s", "--min-samples", "100000")) == 3
    assert "fewer than the minimum 100000" in capsys.readouterr().out
    assert main(_canary(regression_store, "--slo", "ttft_p99=soon")) == 2
    assert "cannot read 'soon' as a duration" in capsys.readouterr().err
    assert main(_canary(regression_store)) == 2  # no SLO


def test_dry_run_exits_zero_and_records_the_real_verdict(
    regression_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_canary(regression_store, "--slo", "ttft_p99=3s", "--dry-run", "--format", "json")) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout stays machine-readable
    assert doc["verdict"] == "pass"
    assert doc["dry_run"] is True
    assert doc["real_verdict"] == "fail"
    assert "real verdict fail" in captured.err


def test_markdown_and_the_console_script(regression_store: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sre_agent",
            *_canary(
                regression_store, "--slo", "ttft_p99=3s", "--max-regression", "ttft_p99=15%", "--format", "markdown"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("## canary verdict: FAIL")
    assert "| ttft_p99 regression | fail |" in done.stdout


def test_help_ends_with_an_example() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sre_agent", "canary", "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "exit codes: 0 pass, 1 fail, 3 inconclusive" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].strip().startswith("sre-agent canary")


def test_could_not_evaluate_exits_4_with_one_line(
    regression_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unreachable server, missing or foreign store, unknown version or service: exit 4, not 1 (a verdict)."""
    import socket

    import duckdb

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    foreign = tmp_path / "foreign.duckdb"
    duckdb.connect(str(foreign)).close()
    cases = {
        "unreachable": ["canary", "--url", f"http://127.0.0.1:{port}", "--since-last-deploy", "--slo", "ttft_p99=3s"],
        "missing store": ["canary", "--db", str(tmp_path / "no.duckdb"), "--since-last-deploy", "--slo", "e2e_p99=3s"],
        "not a store": ["canary", "--db", str(foreign), "--since-last-deploy", "--slo", "ttft_p99=3s"],
        "unknown version": [
            *_canary(regression_store, "--slo", "ttft_p99=3s")[:3],
            "--baseline-version",
            "v1",
            "--candidate-version",
            "v9",
            "--slo",
            "ttft_p99=3s",
        ],
        "unknown service": [*_canary(regression_store, "--slo", "ttft_p99=3s"), "--service", "nope"],
    }
    for name, argv in cases.items():
        assert main(argv) == 4, name
        err = capsys.readouterr().err
        assert err.startswith("error: could not evaluate"), (name, err)
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, (name, err)


def test_require_equivalence_is_stricter(regression_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """e2e p99 moved 1.06x against +20 %: no significant regression (pass), but not shown to hold (3)."""
    check = ("--max-regression", "e2e_p99=20%", "--format", "json")
    assert main(_canary(regression_store, *check)) == 0
    assert json.loads(capsys.readouterr().out)["method"]["pass_rule"] == "no-significant-regression"
    assert main(_canary(regression_store, *check, "--require-equivalence")) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["method"]["pass_rule"] == "equivalence"
    assert doc["verdict"] == "inconclusive"


def test_a_where_filter_that_matches_nothing_cannot_be_evaluated(
    regression_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_canary(regression_store, "--slo", "ttft_p99=3s"), "--where", "tenant.id=nobody"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: could not evaluate")
    assert "tenant.id=nobody" in err
