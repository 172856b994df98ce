"""`sre-agent tui`: argument handling, help with examples, and textual loaded only when the console runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sre_agent.cli import main
from sre_agent.cli.tui import parse_slos
from sre_agent.errors import UsageError


def test_help_names_keys_and_ends_with_examples() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sre_agent", "tui", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--since-last-deploy" in out
    assert "--refresh" in out
    assert "? help" in out
    assert out.rstrip().splitlines()[-1].strip().startswith("sre-agent tui")


def test_slo_flags_parse_durations() -> None:
    assert parse_slos(["ttft=2s", "tpot=80ms", "e2e=1m"]) == {"ttft": 2.0, "tpot": 0.08, "e2e": 60.0}
    for bad in ("latency=2s", "ttft", "ttft=soon"):
        with pytest.raises(UsageError):
            parse_slos([bad])


@pytest.mark.parametrize(
    "argv",
    [
        ["tui", "--db", "x.duckdb", "--refresh", "0"],
        ["tui", "--db", "x.duckdb", "--deploy-at", "not-a-time"],
        ["tui", "--db", "x.duckdb", "--slo", "ttft"],
        ["tui", "--since-last-deploy", "--baseline-version", "v1", "--candidate-version", "v2"],
    ],
)
def test_usage_errors_exit_2_before_the_console_starts(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_the_command_module_does_not_load_textual() -> None:
    code = "import sys, sre_agent.cli, sre_agent.cli.tui; sre_agent.cli.build_parser(); print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_without_a_terminal_exits_1_with_one_line_at_once(synth_db: Path) -> None:
    """Piped stdin and stderr (cron, CI, `| less`): a readable line and exit 1, not a console spinning on EOF."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sre_agent", "tui", "--db", str(synth_db)],
            stdin=subprocess.DEVNULL,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the console without a terminal did not exit within 60 s") from exc
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: the console needs a terminal")
    assert "sre-agent diagnose" in lines[0]
    assert done.stdout == ""  # no escape codes written anywhere
    assert time.monotonic() - started < 30
