"""Helpers shared by the console tests: bounded waits and screen text.

Kept out of conftest.py so test modules can import them by a unique name (several conftest
modules share the name ``conftest`` when pytest is given more than one test folder).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from textual.app import App
from textual.pilot import Pilot
from textual.widgets import DataTable

from sre_agent.analysis.selection import Selection
from sre_agent.tui.app import IncidentApp
from sre_agent.tui.source import DiagnosisUnavailableError, LocalSource

#: The replayed incident: the bundled scenario whose expected cause is prefix_cache, at 30 % of its length.
REPLAY_SCENARIO = "prefix_cache_disabled"
REPLAY_SCALE = "0.3"

READY_TIMEOUT_S = 60.0


async def wait_until(
    condition: Callable[[], bool], timeout_s: float = 60.0, pause: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Poll ``condition`` until true (bounded), yielding to the app between polls."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        if pause is not None:
            await pause()
        else:
            await asyncio.sleep(0.02)


def screen_text(app: App[Any]) -> str:
    """What the terminal shows right now, as plain text lines."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def settle(pilot: Pilot[Any], timeout_s: float = 60.0) -> None:
    """Wait until the overview, drill-down and diagnosis have all arrived (bounded)."""
    app = pilot.app
    assert isinstance(app, IncidentApp)

    def done() -> bool:
        table = app.query_one("#slices-table", DataTable)
        return (
            app.overview is not None
            and table.row_count > 0
            and not app.query_one("#findings-tree").loading
            and not any(w.is_running for w in app.workers)
        )

    await wait_until(done, timeout_s, pilot.pause)
    await pilot.pause()


class FixtureReportSource(LocalSource):
    """A real local store whose diagnosis is a stored engine report (tests of rendering, not of the engine)."""

    def __init__(self, path: str, report: dict[str, Any] | None) -> None:
        super().__init__(path)
        self.description = "db incident.duckdb"  # stable across tmp paths, for snapshots
        self.report = report

    def diagnose(self, selection: Selection) -> dict[str, Any]:
        if self.report is None:
            raise DiagnosisUnavailableError("the diagnose engine is not installed")
        return self.report
