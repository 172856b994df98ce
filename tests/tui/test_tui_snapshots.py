"""SVG snapshots of the main screens at 80x24, dark and light (update with --snapshot-update)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from tui_helpers import settle

from sre_agent.tui.app import IncidentApp

MakeApp = Callable[..., IncidentApp]


def after(*keys: str) -> Callable[[Pilot[Any]], Any]:
    """A run_before that waits for every figure, presses ``keys``, and waits again."""

    async def run(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        if keys:
            await pilot.press(*keys)
            await settle(pilot)

    return run


@pytest.mark.parametrize(
    ("keys", "light"),
    [
        pytest.param((), False, id="overview"),
        pytest.param((), True, id="overview-light"),
        pytest.param(("f",), False, id="findings"),
        pytest.param(("s",), False, id="drilldown"),
        pytest.param(("t",), False, id="traces"),
        pytest.param(("question_mark",), True, id="help-light"),
    ],
)
def test_screen_snapshot(snap_compare: Any, make_app: MakeApp, keys: tuple[str, ...], light: bool) -> None:
    assert snap_compare(make_app(light=light), terminal_size=(80, 24), run_before=after(*keys))
