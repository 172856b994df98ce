"""The incident console: what regressed, since which deploy, where, and why.

The app never queries on its event loop: every question to the data source
runs in a thread worker that posts a past-tense message (``OverviewLoaded``,
``ReportLoaded``...). The overview tiles are asked first so figures paint
fast; the timeline, diagnosis and drill-down follow once they are in.
Failures open an :class:`ErrorScreen`; in live mode an unreachable server
shows a banner instead and the interval keeps retrying.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import httpx
from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import DataTable, Static, TabbedContent, TabPane
from textual.worker import Worker

from sre_agent.analysis.explore import DEFAULT_SLOS, LATENCY_METRICS, Overview, Tile
from sre_agent.analysis.explore_slices import SliceRow
from sre_agent.analysis.selection import Selection
from sre_agent.errors import RemoteError, SreAgentError
from sre_agent.tui.findings import FindingsTree, finding_markdown, finding_title, regression_line, report_markdown
from sre_agent.tui.messages import (
    DrilldownLoaded,
    ExemplarsLoaded,
    OverviewLoaded,
    QueryFailed,
    ReportLoaded,
    SourceReachable,
    SourceUnreachable,
    TimelineLoaded,
    WaterfallLoaded,
)
from sre_agent.tui.screens import ComparisonScreen, ErrorScreen, HelpScreen
from sre_agent.tui.source import DataSource, DiagnosisUnavailableError
from sre_agent.tui.widgets import (
    RateTile,
    StagesView,
    TileView,
    TimelineView,
    WaterfallView,
    fmt_s,
    fmt_share,
    rate_texts,
)

__all__ = ["IncidentApp"]

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=Message)

NO_FINDINGS = "no rule explains the regression: see the slices (s) and traces (t)"

KEY_BAR = (
    "[b]?[/b] help  [b]o f s t[/b] panes  [b]⏎[/b] open  [b]c[/b] copy  "
    "[b]b v[/b] compare  [b]r[/b] refresh  [b]q[/b] quit"
)


def _while_mounted(handler: Callable[[IncidentApp, _M], None]) -> Callable[[IncidentApp, _M], None]:
    """Drop a worker's late answer that arrives while the app is shutting down (its widgets are gone)."""

    @functools.wraps(handler)
    def handle(app: IncidentApp, message: _M) -> None:
        with contextlib.suppress(NoMatches):
            handler(app, message)

    return handle


def headline_tile(ov: Overview) -> Tile:
    """The tile the headline names: the latency whose p99 rose the most (the first tile when none has data)."""
    return max(ov.tiles, key=lambda t: t.p99_ratio or 0.0)


def where_text(slices: list[SliceRow], label: str, ov: Overview | None) -> str:
    """The headline's "Where:" answer: the top slice only when it stands out from the rest.

    A slice's share of the slow excess alone is no location: under a uniform
    slowdown each half of a random 50/50 split holds about half of it.
    """
    top = slices[0] if slices else None
    if top is None or not top.stands_out or top.contribution is None:
        return "no slice stands out: none grew significantly more than the rest" if slices else ""
    traffic = ""
    if ov is not None and ov.requests_candidate:
        traffic = f" from {fmt_share(top.requests_candidate / ov.requests_candidate)} of requests"
    return f"{top.dimension}={top.value} holds {fmt_share(top.contribution)} of the slow {label} excess{traffic}"


def _unreachable(exc: BaseException) -> bool:
    """A transport failure (refused, timed out) rather than an answer the user must read."""
    return isinstance(exc, RemoteError) and isinstance(exc.__cause__, httpx.TransportError)


class IncidentApp(App[int]):
    """The console. ``source`` answers the queries; ``selection`` is the comparison to start with.

    Args:
        source: a LocalSource (``--db``) or RemoteSource (``--url``).
        selection: the initial comparison (``--since-last-deploy`` by default).
        slos: p99 targets in seconds per latency metric (see ``explore.DEFAULT_SLOS``).
        refresh_s: live-mode refresh interval in seconds (``None`` = only on ``r``).
        export_dir: where ``c`` also writes the Markdown it copies (default: the temp dir).
        metric: the latency the drill-down (timeline, stages, slices, traces) breaks down;
            ``None`` follows the headline, the tile whose p99 rose the most.
    """

    CSS_PATH = "app.tcss"
    # The diagnosis is the expensive question: live refreshes repeat it at most this often.
    DIAGNOSIS_EVERY_S = 60.0
    TITLE = "sre-agent"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("o", "show_tab('overview')", "overview"),
        Binding("f", "show_tab('findings')", "findings"),
        Binding("s", "show_tab('drilldown')", "slices"),
        Binding("t", "show_tab('traces')", "traces"),
        Binding("c", "copy", "copy md"),
        Binding("b", "compare('deploy')", "deploy"),
        Binding("v", "compare('versions')", "versions"),
        Binding("x", "clear_scope", "unscope", show=False),
        Binding("r", "refresh", "refresh"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(
        self,
        source: DataSource,
        selection: Selection | None = None,
        *,
        slos: Mapping[str, float] | None = None,
        refresh_s: float | None = 10.0,
        export_dir: Path | None = None,
        metric: str | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.selection = selection or Selection(mode="since_last_deploy")
        self.slos = {**DEFAULT_SLOS, **(slos or {})}
        self.refresh_s = refresh_s if source.live else None
        self.export_dir = export_dir or Path(tempfile.gettempdir())
        self.follow_headline = metric is None
        self.metric = metric or "e2e"
        self.generation = 0  # counts loads (refreshes and re-selections)
        self._inflight: dict[str, tuple[Hashable, Worker[None]]] = {}
        self._diagnosed_at: dict[Selection, float] = {}  # monotonic start of the last diagnosis
        self._forced = True
        self.overview: Overview | None = None
        self.report: dict[str, Any] | None = None
        self.report_reason = "diagnosing…"
        self.top_slice = ""
        self.unreachable: str | None = None
        self.started = time.perf_counter()
        self.first_paint_s: float | None = None
        self.last_export: Path | None = None
        # Imports and the store open overlap Textual's own start-up instead of following it.
        threading.Thread(target=source.warm, name="sre-agent-warm", daemon=True).start()

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Static("sre-agent", id="title")
        yield Static("", id="banner")
        with TabbedContent(initial="overview"):
            with TabPane("Overview", id="overview"):
                with Horizontal(id="tiles"):
                    for metric in LATENCY_METRICS:
                        yield TileView("…", id=f"tile-{metric}")
                with Horizontal(id="rates"):
                    for name in ("rate", "errors", "goodput"):
                        yield RateTile("…", id=f"tile-{name}")
                yield TimelineView("loading timeline…", id="timeline")
                yield Static("", id="headline")
            with TabPane("Findings", id="findings"):
                yield Static("diagnosing…", id="regression")
                yield FindingsTree(id="findings-tree")
            with TabPane("Drill-down", id="drilldown"):
                yield StagesView("loading stage breakdown…", id="stages")
                yield DataTable(id="slices-table", cursor_type="row", zebra_stripes=True)
            with TabPane("Traces", id="traces"):
                yield DataTable(id="exemplars-table", cursor_type="row", zebra_stripes=True)
                yield WaterfallView("select a trace", id="waterfall")
        # A fixed key bar instead of Footer: Footer recomposes on every focus change, which made
        # switching panes cost several hundred milliseconds.
        yield Static(KEY_BAR, id="keybar")

    def on_mount(self) -> None:
        self.query_one("#slices-table", DataTable).add_columns(
            "dimension", "value", "stands out", "share", "requests", "slow"
        )
        self.query_one("#exemplars-table", DataTable).add_columns(
            "side", "trace", "e2e", "ttft", "queue", "host", "model", "version"
        )
        self.query_one("#findings-tree").loading = True
        self._update_title()
        self.load_all()
        if self.refresh_s:
            self.set_interval(self.refresh_s, self._tick)

    # --------------------------------------------------------------- workers

    def _fetch(self, what: str, key: Hashable, query: Callable[[], Message | Iterator[Message]]) -> None:
        """Run ``query`` in a thread worker and post its message(s), or the failure.

        A query of the same kind already running for the same ``key`` (selection,
        trace) is left to finish rather than started again: live refreshes must
        not pile slow diagnoses onto the server.
        """
        running = self._inflight.get(what)
        if running is not None and running[0] == key and running[1].is_running:
            return

        def run() -> None:
            try:
                result = query()
                for message in [result] if isinstance(result, Message) else result:
                    self.post_message(message)
            except SreAgentError as exc:
                if _unreachable(exc):
                    self.post_message(SourceUnreachable(str(exc)))
                else:
                    self.post_message(QueryFailed(what, str(exc)))
                return
            except Exception as exc:  # a bug must not kill the console: show it, log it
                log.exception("%s failed", what)
                self.post_message(QueryFailed(what, f"{type(exc).__name__}: {exc}"))
                return
            if self.source.live:
                self.post_message(SourceReachable())

        worker = self.run_worker(run, name=what, group=what, thread=True, exit_on_error=False)
        self._inflight[what] = (key, worker)

    def load_all(self, *, forced: bool = True) -> None:
        """Ask for the overview first; the rest follows when it arrives.

        ``forced=False`` (the live interval) re-runs the diagnosis only when the
        last one for this selection started ``DIAGNOSIS_EVERY_S`` ago or more.
        """
        self._forced = forced
        self.generation += 1
        sel = self.selection
        self._fetch(
            "overview", (sel, self.generation), lambda: OverviewLoaded(sel, self.source.overview(sel, self.slos))
        )

    def _load_rest(self, sel: Selection) -> None:
        metric, source = self.metric, self.source

        def drill() -> Iterator[Message]:
            # One query at a time, cheapest first: each fills its pane as soon as it is in,
            # and the event loop keeps a core while the diagnosis runs beside it.
            yield TimelineLoaded(sel, source.timeline(sel, metric, 60))
            yield ExemplarsLoaded(sel, source.exemplars(sel, metric))
            slices = source.slices(sel, metric)
            yield DrilldownLoaded(sel, source.stages(sel, metric), slices)

        def diagnosis() -> Message:
            try:
                return ReportLoaded(sel, source.diagnose(sel))
            except DiagnosisUnavailableError as exc:
                return ReportLoaded(sel, None, str(exc))

        last = self._diagnosed_at.get(sel)
        if self._forced or last is None or time.monotonic() - last >= self.DIAGNOSIS_EVERY_S:
            self._diagnosed_at[sel] = time.monotonic()
            if self.report is None:  # a retry after a failure: say it is running again
                self.report_reason = "diagnosing…"
            self._fetch("diagnosis", sel, diagnosis)
        self._fetch("drill-down", sel, drill)

    def _tick(self) -> None:
        running = self._inflight.get("overview")
        if running is None or not running[1].is_running:
            self.load_all(forced=False)

    # -------------------------------------------------------------- messages

    @_while_mounted
    def on_overview_loaded(self, message: OverviewLoaded) -> None:
        if message.selection != self.selection:
            return
        ov = self.overview = message.overview
        for tile in ov.tiles:
            self.query_one(f"#tile-{tile.metric}", TileView).show(tile)
        for name, (label, text, worse) in zip(("rate", "errors", "goodput"), rate_texts(ov), strict=True):
            self.query_one(f"#tile-{name}", RateTile).show(label, text, worse)
        if self.first_paint_s is None:
            self.first_paint_s = time.perf_counter() - self.started
        if self.follow_headline:
            # The drill-down explains the headline's metric: a TTFT headline over an e2e breakdown misleads.
            self.metric = headline_tile(ov).metric
        self._update_title()
        self._update_headline()
        self._load_rest(message.selection)

    @_while_mounted
    def on_timeline_loaded(self, message: TimelineLoaded) -> None:
        if message.selection == self.selection:
            self.query_one(TimelineView).show(message.timeline, LATENCY_METRICS[self.metric][1])

    @_while_mounted
    def on_report_loaded(self, message: ReportLoaded) -> None:
        if message.selection != self.selection:
            return
        tree = self.query_one(FindingsTree)
        tree.loading = False
        self.report = message.report
        if message.report is None:
            self.report_reason = message.reason or "diagnosis unavailable"
            self.query_one("#regression", Static).update(self.report_reason)
            tree.clear()
        else:
            # A report without findings is an answer too: say so instead of "diagnosing…" forever.
            self.report_reason = "" if message.report.get("findings") else NO_FINDINGS
            summary = regression_line(message.report) or "no regression summary"
            self.query_one("#regression", Static).update(summary + (f"\n{NO_FINDINGS}" if self.report_reason else ""))
            tree.show_report(message.report)
        self._update_headline()

    @_while_mounted
    def on_drilldown_loaded(self, message: DrilldownLoaded) -> None:
        if message.selection != self.selection:
            return
        self.query_one(StagesView).show(message.stages)
        table = self.query_one("#slices-table", DataTable)
        keep = table.cursor_row
        table.clear()
        for row in message.slices:
            share = fmt_share(row.contribution)
            table.add_row(
                row.dimension,
                row.value,
                "yes" if row.stands_out else "",
                share,
                f"{row.requests_baseline}→{row.requests_candidate}",
                f"{fmt_share(row.slow_share_baseline)}→{fmt_share(row.slow_share_candidate)}",
                key=f"{row.dimension}\x1f{row.value}",
            )
        if message.slices:
            table.move_cursor(row=min(keep, len(message.slices) - 1))
        self.top_slice = where_text(message.slices, LATENCY_METRICS[self.metric][1], self.overview)
        self._update_headline()

    @_while_mounted
    def on_exemplars_loaded(self, message: ExemplarsLoaded) -> None:
        if message.selection != self.selection:
            return
        table = self.query_one("#exemplars-table", DataTable)
        keep = table.cursor_row
        table.clear()
        for ex in message.exemplars:
            table.add_row(
                ex.side,
                ex.trace_id[:12],
                fmt_s(ex.e2e_s),
                fmt_s(ex.ttft_s),
                fmt_s(ex.queue_s),
                ex.host_name or "–",
                ex.model or "–",
                ex.version or "–",
                key=f"{ex.trace_id}\x1f{ex.start_ns}",
            )
        if message.exemplars:
            table.move_cursor(row=min(keep, len(message.exemplars) - 1))

    @_while_mounted
    def on_waterfall_loaded(self, message: WaterfallLoaded) -> None:
        self.query_one(WaterfallView).show(message.trace_id, message.spans)

    @_while_mounted
    def on_query_failed(self, message: QueryFailed) -> None:
        if message.what == "diagnosis":
            self.query_one(FindingsTree).loading = False
            self.report_reason = "diagnosis failed (r retries)"
            self.query_one("#regression", Static).update(f"diagnosis failed: {message.error}")
            self._update_headline()
        self.push_screen(ErrorScreen(f"{message.what} failed", message.error))

    @_while_mounted
    def on_source_unreachable(self, message: SourceUnreachable) -> None:
        self.unreachable = message.error
        banner = self.query_one("#banner", Static)
        every = f"retrying every {self.refresh_s:g} s; " if self.refresh_s else ""
        banner.update(f"⚠ {self.source.description} unreachable: {message.error} — {every}press r to retry now")
        banner.add_class("-shown")

    @_while_mounted
    def on_source_reachable(self, message: SourceReachable) -> None:
        if self.unreachable is not None:
            self.unreachable = None
            self.query_one("#banner", Static).remove_class("-shown")

    @on(DataTable.RowSelected, "#slices-table")
    def _slice_selected(self, event: DataTable.RowSelected) -> None:
        dimension, value = str(event.row_key.value).split("\x1f", 1)
        where = (*((k, v) for k, v in self.selection.where if k != dimension), (dimension, value))
        self._reselect(dataclasses.replace(self.selection, where=where))
        self.notify(f"scoped to {dimension}={value} (x clears)", timeout=3)

    @on(DataTable.RowHighlighted, "#exemplars-table")
    def _exemplar_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is None:
            return
        trace_id, start = str(event.row_key.value).split("\x1f", 1)
        self.query_one(WaterfallView).update(f"loading trace {trace_id[:16]}…")
        self._fetch("trace", trace_id, lambda: WaterfallLoaded(trace_id, self.source.waterfall(trace_id, int(start))))

    # --------------------------------------------------------------- actions

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        focus = {"findings": "#findings-tree", "drilldown": "#slices-table", "traces": "#exemplars-table"}
        if tab in focus:
            self.query_one(focus[tab]).focus()

    def action_refresh(self) -> None:
        self.notify("refreshing…", timeout=1)
        self.load_all()

    def action_clear_scope(self) -> None:
        if self.selection.where:
            self._reselect(dataclasses.replace(self.selection, where=()))

    def action_compare(self, mode: str) -> None:
        def apply(selection: Selection | None) -> None:
            if selection is not None:
                self._reselect(selection)

        service = self.selection.service
        screen = ComparisonScreen(mode, self.selection, lambda: self.source.versions(service))
        self.push_screen(screen, apply)

    def action_copy(self) -> None:
        if self.report is None:
            self.notify(f"nothing to copy yet: {self.report_reason}", severity="warning")
            return
        tabs = self.query_one(TabbedContent)
        finding = self.query_one(FindingsTree).selected_finding if tabs.active == "findings" else None
        if finding is not None:
            text, what = finding_markdown(finding), f"finding #{finding.get('rank')}"
        else:
            label = self.overview.scope.label if self.overview else ""
            text, what = report_markdown(self.report, label), "the diagnosis"
        self.copy_to_clipboard(text)
        path = self.export_dir / f"sre-agent-diagnosis-{time.strftime('%Y%m%dT%H%M%S')}.md"
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            self.notify(f"copied {what}; could not save {path}: {exc}", severity="warning")
            return
        self.last_export = path
        self.notify(f"copied {what} as Markdown; also saved to {path}", timeout=6)

    # --------------------------------------------------------------- helpers

    def _reselect(self, selection: Selection) -> None:
        self.selection = selection
        self.report = None
        self.report_reason = "diagnosing…"
        self.top_slice = ""
        self.query_one(FindingsTree).loading = True
        self._update_title()
        self.load_all()

    def _update_title(self) -> None:
        scope = " ".join(f"{k}={v}" for k, v in self.selection.where) or "all traffic"
        self.query_one("#title", Static).update(f"sre-agent │ {scope} │ {self.source.description} │ ? help")

    def _update_headline(self) -> None:
        """What regressed, why, where and since when: the four answers at a glance."""
        if self.overview is None:
            return
        ov = self.overview
        worst = headline_tile(ov)
        what = f"What:  {worst.label} p99 {fmt_s(worst.p99_baseline)}→{fmt_s(worst.p99_candidate)}"
        if worst.p99_ratio is not None:
            what += f" ×{worst.p99_ratio:.2f}" + (" (SLO breach)" if worst.status == "breach" else "")
        findings = (self.report or {}).get("findings") or []
        why = f"Why:   {finding_title(findings[0])}" if findings else f"Why:   {self.report_reason}"
        where = f"Where: {self.top_slice}" if self.top_slice else "Where: …"
        since = f"Since: {ov.scope.label} · {ov.requests_baseline} vs {ov.requests_candidate} req"
        self.query_one("#headline", Static).update(
            Text("\n".join((what, why, where, since)), no_wrap=True, overflow="ellipsis")
        )
