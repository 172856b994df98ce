"""Messages workers post back to the app, named in the past tense for what happened.

Every data message carries the selection it was computed for: when the
comparison changes while a query is still running, the app drops the late
answer instead of painting stale figures over new ones.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message

from sre_agent.analysis.explore import Exemplar, Overview, StageBreakdown, Timeline, WaterfallSpan
from sre_agent.analysis.explore_slices import SliceRow
from sre_agent.analysis.selection import Selection

__all__ = [
    "DrilldownLoaded",
    "ExemplarsLoaded",
    "OverviewLoaded",
    "QueryFailed",
    "ReportLoaded",
    "SourceReachable",
    "SourceUnreachable",
    "TimelineLoaded",
    "WaterfallLoaded",
]


class _ForSelection(Message):
    def __init__(self, selection: Selection) -> None:
        super().__init__()
        self.selection = selection


class OverviewLoaded(_ForSelection):
    """The SLO tiles' figures arrived."""

    def __init__(self, selection: Selection, overview: Overview) -> None:
        super().__init__(selection)
        self.overview = overview


class TimelineLoaded(_ForSelection):
    """The p99 timeline arrived."""

    def __init__(self, selection: Selection, timeline: Timeline) -> None:
        super().__init__(selection)
        self.timeline = timeline


class ReportLoaded(_ForSelection):
    """The diagnosis arrived; ``report`` is ``None`` when diagnosis is unavailable (``reason`` says why)."""

    def __init__(self, selection: Selection, report: dict[str, Any] | None, reason: str = "") -> None:
        super().__init__(selection)
        self.report = report
        self.reason = reason


class DrilldownLoaded(_ForSelection):
    """The tail's stage breakdown and the slices table arrived."""

    def __init__(self, selection: Selection, stages: StageBreakdown, slices: list[SliceRow]) -> None:
        super().__init__(selection)
        self.stages = stages
        self.slices = slices


class ExemplarsLoaded(_ForSelection):
    """The slow exemplar traces of both sides arrived."""

    def __init__(self, selection: Selection, exemplars: list[Exemplar]) -> None:
        super().__init__(selection)
        self.exemplars = exemplars


class WaterfallLoaded(Message):
    """The spans of one trace arrived."""

    def __init__(self, trace_id: str, spans: list[WaterfallSpan]) -> None:
        super().__init__()
        self.trace_id = trace_id
        self.spans = spans


class QueryFailed(Message):
    """A query failed for a reason the user should read (opens a modal)."""

    def __init__(self, what: str, error: str) -> None:
        super().__init__()
        self.what = what
        self.error = error


class SourceUnreachable(Message):
    """The live server could not be reached (shows the banner, keeps retrying)."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class SourceReachable(Message):
    """The live server answered again (hides the banner)."""
