"""Modal screens: help, errors, and changing the comparison."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import ClassVar

from rich.table import Table
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from sre_agent.analysis.explore import VersionInfo
from sre_agent.analysis.selection import Selection, parse_duration, parse_time
from sre_agent.errors import SreAgentError

__all__ = ["ComparisonScreen", "ErrorScreen", "HelpScreen", "versions_text"]

HELP_ROWS: tuple[tuple[str, str], ...] = (
    ("?", "this help"),
    ("o / f / s / t", "overview / findings / drill-down (slices) / traces"),
    ("tab, shift+tab", "move between panes"),
    ("enter", "expand a finding · narrow to a slice · open a trace"),
    ("stands out", "a slice grew more than the rest, beyond chance"),
    ("x", "clear the slice filter"),
    ("c", "copy the selected finding (or all) as Markdown"),
    ("b", "compare before/after a deploy time"),
    ("v", "compare two service.version values"),
    ("r", "refresh now (retry when the server is unreachable)"),
    ("q", "quit"),
)


class HelpScreen(ModalScreen[None]):
    """The key bindings; any of escape, ? or q closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,question_mark,q", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column(style="bold")
        table.add_column()
        for key, what in HELP_ROWS:
            table.add_row(key, what)
        with Vertical(id="help-box", classes="modal-box"):
            yield Label("sre-agent incident console — keys", classes="modal-title")
            yield Static(table, id="help-table")
            yield Label("mouse: click tabs, rows and findings", classes="dim")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)


class ErrorScreen(ModalScreen[None]):
    """An error the user should read; the app keeps running underneath."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,enter", "dismiss", "close")]

    def __init__(self, title: str, message: str) -> None:
        super().__init__()
        self.title_text = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box", classes="modal-box"):
            yield Label(self.title_text, classes="modal-title")
            yield Static(self.message, id="error-message")
            yield Button("OK", id="error-ok", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)


def versions_text(found: list[VersionInfo]) -> str:
    """The versions present, one line each, oldest first: name, engine requests, first and last seen."""
    if not found:
        return "no service.version on any engine request: compare by deploy time (b) instead"
    services = {v.service for v in found}
    lines = ["versions present (engine requests, first → last seen):"]
    for v in found:
        name = f"{v.service} {v.version}" if len(services) > 1 else v.version
        lines.append(f"  {name:<18} {v.requests:>9,}  {v.first[:19]} → {v.last[11:19]}")
    return "\n".join(lines)


class ComparisonScreen(ModalScreen[Selection | None]):
    """Enter a deploy time (``b``) or a version pair (``v``); returns the new selection or ``None``.

    ``list_versions`` (blocking; run in a thread) fills the version dialog with
    the versions present, and proposes the last two when nothing is entered yet.
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(
        self, mode: str, current: Selection, list_versions: Callable[[], list[VersionInfo]] | None = None
    ) -> None:
        super().__init__()
        self.mode = mode
        self.current = current
        self.list_versions = list_versions

    def compose(self) -> ComposeResult:
        with Vertical(id="comparison-box", classes="modal-box"):
            if self.mode == "versions":
                yield Label("Compare two versions (service.version)", classes="modal-title")
                yield Static("versions present: loading…", id="versions-list", classes="dim")
                yield Input(self.current.baseline_version or "", placeholder="baseline version, e.g. v1", id="first")
                yield Input(self.current.candidate_version or "", placeholder="candidate version, e.g. v2", id="second")
            else:
                yield Label("Compare before/after a deploy", classes="modal-title")
                yield Input(placeholder="deploy time: ISO 8601 or Unix s (empty = last deploy)", id="first")
                yield Input(placeholder="window per side, e.g. 15m (empty = longest)", id="second")
            yield Label("enter to apply, escape to cancel", id="comparison-hint", classes="dim")

    def on_mount(self) -> None:
        if self.mode == "versions" and self.list_versions is not None:
            self._load_versions(self.list_versions)

    @work(thread=True, exit_on_error=False)
    def _load_versions(self, list_versions: Callable[[], list[VersionInfo]]) -> None:
        try:
            found: list[VersionInfo] | None = list_versions()
            text = versions_text(found or [])
        except SreAgentError as exc:
            found, text = None, f"versions present: unknown ({exc})"
        except Exception as exc:  # a bug must not leave the dialog saying "loading…": show it
            found, text = None, f"versions present: unknown ({type(exc).__name__}: {exc})"
        self.app.call_from_thread(self._show_versions, text, found)

    def _show_versions(self, text: str, found: list[VersionInfo] | None) -> None:
        with contextlib.suppress(NoMatches):  # the dialog was closed before the answer came
            self.query_one("#versions-list", Static).update(text)
            first, second = self.query_one("#first", Input), self.query_one("#second", Input)
            if found and len(found) >= 2 and not first.value and not second.value:
                first.value, second.value = found[-2].version, found[-1].version

    def on_input_submitted(self, event: Input.Submitted) -> None:
        first = self.query_one("#first", Input).value.strip()
        second = self.query_one("#second", Input).value.strip()
        if event.input.id == "first" and not (self.mode == "deploy" and not first):
            self.query_one("#second", Input).focus()
            return
        try:
            self.dismiss(self._selection(first, second))
        except SreAgentError as exc:
            self.query_one("#comparison-hint", Label).update(f"[b]{exc}[/b]")

    def _selection(self, first: str, second: str) -> Selection:
        service, where = self.current.service, self.current.where
        if self.mode == "versions":
            return Selection(
                mode="versions", baseline_version=first, candidate_version=second, service=service, where=where
            )
        window = parse_duration(second) if second else None
        if not first:
            return Selection(mode="since_last_deploy", window_ns=window, service=service, where=where)
        return Selection(
            mode="deploy_at", deploy_at_ns=parse_time(first), window_ns=window, service=service, where=where
        )

    def action_cancel(self) -> None:
        self.dismiss(None)
