"""`sre-agent canary` on a store file: exit codes 0 pass, 1 fail, 3 inconclusive, 2 usage."""

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
