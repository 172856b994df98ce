"""Selection parsing: times, durations, windows and the four modes."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sre_agent.analysis.selection import Selection, Window, format_time, parse_duration, parse_time, parse_window
from sre_agent.cli._common import add_selection_options, selection_from_args
from sre_agent.errors import UsageError


def test_time_forms_agree() -> None:
    expected = 1_700_000_000 * 10**9
    assert parse_time("1700000000") == expected
    assert parse_time("2023-11-14T22:13:20Z") == expected
    assert parse_time("2023-11-14T23:13:20+01:00") == expected
    assert parse_time("2023-11-14T22:13:20") == expected  # naive is UTC


def test_bad_time_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="ISO 8601"):
        parse_time("yesterday")


@pytest.mark.parametrize(
    ("text", "seconds"), [("250ms", 0.25), ("30s", 30), ("15m", 900), ("2h", 7200), ("1d", 86400), ("90", 90)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == round(seconds * 1e9)


def test_window_must_be_ordered() -> None:
    with pytest.raises(UsageError, match="not after"):
        parse_window("1700000100..1700000000")


@given(st.integers(min_value=0, max_value=4_000_000_000_000), st.integers(min_value=1, max_value=10**6))
def test_format_and_parse_round_trip_to_the_millisecond(start_ms: int, length_ms: int) -> None:
    window = Window(start_ms * 10**6, (start_ms + length_ms) * 10**6)
    text = f"{format_time(window.start_ns)}..{format_time(window.end_ns)}"
    assert parse_window(text) == window


def _parse(*argv: str) -> Selection:
    parser = argparse.ArgumentParser()
    add_selection_options(parser)
    return selection_from_args(parser.parse_args(list(argv)))


def test_cli_modes() -> None:
    assert _parse().mode == "since_last_deploy"
    sel = _parse("--deploy-at", "1700000000", "--window", "15m", "--where", "tenant.id=acme")
    assert (sel.mode, sel.window_ns, sel.where) == ("deploy_at", 900 * 10**9, (("tenant.id", "acme"),))
    assert _parse("--baseline-version", "v1", "--candidate-version", "v2").mode == "versions"
    assert _parse("--baseline", "1..2", "--candidate", "3..4").mode == "windows"


def test_cli_rejects_two_modes_and_half_pairs() -> None:
    with pytest.raises(UsageError, match="choose one"):
        _parse("--deploy-at", "1", "--since-last-deploy")
    with pytest.raises(UsageError, match="go together"):
        _parse("--baseline-version", "v1")
    with pytest.raises(UsageError, match="KEY=VALUE"):
        _parse("--where", "tenant")


def test_dict_round_trip() -> None:
    sel = _parse("--baseline", "1700000000..1700000600", "--candidate", "1700000600..1700001200", "--service", "gw")
    assert Selection.from_dict(sel.to_dict()) == sel
    with pytest.raises(UsageError, match="unknown selection keys"):
        Selection.from_dict({"mode": "windows", "bogus": 1})
