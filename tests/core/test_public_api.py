"""The curated public API: sorted, complete and resolvable."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sre_agent
from sre_agent.cli import main


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert sre_agent.__all__ == sorted(sre_agent.__all__)
    # __all__ is a literal (so type checkers see explicit exports); it must list exactly the lazy names.
    assert set(sre_agent.__all__) == {*sre_agent._LAZY, "__version__"}
    for name in sre_agent.__all__:
        assert getattr(sre_agent, name) is not None, name


def test_public_errors_share_one_root() -> None:
    errors = [getattr(sre_agent, n) for n in sre_agent.__all__ if n.endswith("Error")]
    assert errors
    assert all(issubclass(e, sre_agent.SreAgentError) for e in errors)


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        sre_agent.no_such_name  # noqa: B018


def test_cli_usage_error_exits_2_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-such-flag"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ")
    assert "--no-such-flag" in err
    assert "Traceback" not in err
    assert main([]) == 2  # no command: help on stderr, usage exit code
    out, err = capsys.readouterr()
    assert out == ""
    assert "examples:" in err


def test_console_script_help_has_examples() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sre_agent", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "examples:" in out
