"""Pilot tests: every screen and key binding of the console, asserting on what it shows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
from textual.widgets import DataTable, Input, TabbedContent
from tui_helpers import FixtureReportSource, screen_text, settle, wait_until
from tui_synth import build_store

from sre_agent.analysis import explore, explore_slices
from sre_agent.analysis.selection import Selection
from sre_agent.errors import SreAgentError
from sre_agent.tui.app import NO_FINDINGS, IncidentApp
from sre_agent.tui.findings import FindingsTree
from sre_agent.tui.screens import ComparisonScreen, ErrorScreen, HelpScreen
from sre_agent.tui.source import LocalSource
from sre_agent.tui.widgets import tile_lines

MakeApp = Callable[..., IncidentApp]


def expected_overview(db: Path, selection: Selection | None = None) -> explore.Overview:
    con = duckdb.connect(str(db), read_only=True)
    try:
        scope = explore.resolve_scope(con, selection or Selection(mode="since_last_deploy"))
        return explore.overview(con, scope)
    finally:
        con.close()


async def test_overview_answers_what_where_why_and_since(make_app: MakeApp, synth_db: Path) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        ov = expected_overview(synth_db)
        for tile in ov.tiles:
            p50, p99 = tile_lines(tile)
            assert p99 in text, (tile.metric, p99)
            assert p50 in text
        ttft = next(t for t in ov.tiles if t.metric == "ttft")
        assert ttft.status == "breach"
        assert app.query_one("#tile-ttft").has_class("-breach")
        assert app.query_one("#tile-tpot").has_class("-ok")
        assert "What:  TTFT p99" in text
        assert "Why:   #1 prefill_slowdown" in text
        assert "Where: host_name=gpu-3" in text
        assert "Since: deploy v2 at 2026-05-28T20:56:40.000Z (after v1)" in text
        assert "▲v2" in text  # the deploy marker under the timeline
        assert app.first_paint_s is not None


async def test_tab_keys_switch_panes_and_tab_moves_focus(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        tabs = app.query_one(TabbedContent)
        for key, pane in (("f", "findings"), ("s", "drilldown"), ("t", "traces"), ("o", "overview")):
            await pilot.press(key)
            assert tabs.active == pane
        await pilot.press("f")
        assert app.focused is app.query_one(FindingsTree)
        await pilot.press("tab")
        assert app.focused is not app.query_one(FindingsTree)
        await pilot.press("shift+tab")
        assert app.focused is app.query_one(FindingsTree)


async def test_findings_expand_with_enter_and_show_evidence(make_app: MakeApp, synth_report: dict[str, Any]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("f")
        text = screen_text(app)
        assert "ttft p99 1.56s→13.3s ×8.499" in text
        first = synth_report["findings"][0]
        assert f"next: {first['next_check'][:30]}" in text  # the first finding starts expanded
        tree = app.query_one(FindingsTree)
        second = tree.root.children[1]
        assert not second.is_expanded
        tree.move_cursor(second)
        await pilot.press("enter")
        assert second.is_expanded
        assert (
            tree.selected_finding is synth_report["findings"][1] or tree.selected_finding == synth_report["findings"][1]
        )


async def test_copy_selected_finding_and_whole_report_as_markdown(
    make_app: MakeApp, synth_report: dict[str, Any], tmp_path: Path
) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("f")
        tree = app.query_one(FindingsTree)
        tree.move_cursor(tree.root.children[1])
        await pilot.press("c")
        second = synth_report["findings"][1]
        assert app.clipboard.startswith(f"### #2 {second['cause']}")
        assert app.last_export is not None
        assert app.last_export.parent == tmp_path
        assert app.last_export.read_text(encoding="utf-8") == app.clipboard
        await pilot.press("o", "c")
        assert app.clipboard.startswith("## sre-agent diagnosis")
        assert app.clipboard.count("### #") == len(synth_report["findings"])
        assert "| signal | baseline | candidate | detail |" in app.clipboard


async def test_selecting_a_slice_rescopes_everything_and_x_clears(make_app: MakeApp, synth_db: Path) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("s")
        table = app.query_one("#slices-table", DataTable)
        assert app.focused is table
        first_row = table.get_row_at(0)
        assert first_row[:2] == ["host_name", "gpu-3"]
        assert "prefill" in screen_text(app)  # the stage breakdown above the table
        await pilot.press("enter")
        assert app.selection.where == (("host_name", "gpu-3"),)
        await settle(pilot)
        narrowed = expected_overview(synth_db, Selection(mode="since_last_deploy", where=(("host_name", "gpu-3"),)))
        assert app.overview is not None
        assert app.overview.requests_candidate == narrowed.requests_candidate == 2500
        assert "host_name=gpu-3" in screen_text(app).splitlines()[0]
        await pilot.press("x")
        assert app.selection.where == ()
        await settle(pilot)
        assert app.overview.requests_candidate == 10_000


async def test_traces_show_slow_exemplars_and_a_waterfall(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("t")
        table = app.query_one("#exemplars-table", DataTable)
        sides = [table.get_row_at(i)[0] for i in range(table.row_count)]
        assert sides == ["baseline"] * 5 + ["candidate"] * 5
        candidate_hosts = {table.get_row_at(i)[5] for i in range(5, 10)}
        assert candidate_hosts == {"gpu-3"}
        await pilot.press("down")
        await wait_until(lambda: "llm_request" in screen_text(app), 30, pilot.pause)
        text = screen_text(app)
        assert "retrieval" in text
        assert "POST /v1/" in text


async def test_help_screen_lists_the_keys(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.pause()
        text = screen_text(app)
        assert "copy the selected finding" in text
        assert "compare two service.version values" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_b_changes_the_deploy_time(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("b")
        assert isinstance(app.screen, ComparisonScreen)
        app.screen.query_one("#first", Input).value = "2026-05-28T20:41:40Z"
        app.screen.query_one("#second", Input).value = "10m"
        await pilot.press("enter", "enter")
        assert app.selection.mode == "deploy_at"
        await settle(pilot)
        assert app.overview is not None
        assert app.overview.scope.label == "deploy at 2026-05-28T20:41:40.000Z"
        # ten minutes either side of a time before the incident: nothing regressed there
        assert all(t.status != "breach" for t in app.overview.tiles)


async def test_v_compares_versions_and_rejects_bad_input(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("b")
        app.screen.query_one("#first", Input).value = "yesterday-ish"
        await pilot.press("enter", "enter")
        assert isinstance(app.screen, ComparisonScreen)
        await pilot.pause()
        assert "cannot read time" in screen_text(app)
        await pilot.press("escape")
        await pilot.press("v")
        app.screen.query_one("#first", Input).value = "v1"
        app.screen.query_one("#second", Input).value = "v2"
        await pilot.press("enter", "enter")
        await settle(pilot)
        assert app.overview is not None
        assert app.overview.scope.label == "versions v1 vs v2"
        assert "v1 " in screen_text(app)  # one timeline series per version


async def test_r_refreshes_and_q_quits(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        before = app.generation
        await pilot.press("r")
        assert app.generation == before + 1
        await settle(pilot)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code in (0, None)
    assert not app.is_running


async def test_store_errors_open_a_modal_and_the_app_keeps_running(tmp_path: Path, make_app: MakeApp) -> None:
    app = make_app(db=tmp_path / "missing.duckdb")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: isinstance(app.screen, ErrorScreen), 30, pilot.pause)
        await pilot.pause()
        assert "no store at" in screen_text(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, ErrorScreen)
        await pilot.press("f")
        assert app.query_one(TabbedContent).active == "findings"


async def test_no_deploy_in_the_store_is_explained(tmp_path: Path, make_app: MakeApp) -> None:
    db = build_store(tmp_path / "nodeploy.duckdb", n_requests=3_000, incident=False)
    con = duckdb.connect(str(db))
    con.execute("DELETE FROM deploys")
    con.execute("UPDATE span_rows SET service_version = 'v1'")
    con.close()
    app = make_app(db=db)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: isinstance(app.screen, ErrorScreen), 30, pilot.pause)
        await pilot.pause()
        assert "--deploy-at" in screen_text(app)


async def test_diagnosis_unavailable_keeps_the_rest(make_app: MakeApp) -> None:
    app = make_app(report=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "Why:   the diagnose engine is not installed" in screen_text(app)
        await pilot.press("c")
        assert app.last_export is None
        await pilot.press("f")
        assert "not installed" in screen_text(app)


async def test_light_theme_at_80x24(make_app: MakeApp, synth_db: Path) -> None:
    app = make_app(light=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.theme == "textual-light"
        assert not app.current_theme.dark
        ttft = next(t for t in expected_overview(synth_db).tiles if t.metric == "ttft")
        assert tile_lines(ttft)[1] in screen_text(app)


async def test_real_engine_finds_the_replayed_incident(replay_db: Path, tmp_path: Path) -> None:
    app = IncidentApp(LocalSource(str(replay_db)), export_dir=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: app.report is not None or app.report_reason != "diagnosing…", 180, pilot.pause)
        assert app.report is not None, app.report_reason
        assert app.report["findings"][0]["cause"] == "prefix_cache"
        await pilot.press("f")
        await pilot.pause()
        assert "#1 prefix_cache" in screen_text(app)


async def test_mouse_clicks_tabs_and_rows(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.click("#--content-tab-drilldown")
        assert app.query_one(TabbedContent).active == "drilldown"
        table = app.query_one("#slices-table", DataTable)
        await pilot.click("#slices-table", offset=(2, 2))  # the second data row
        await pilot.pause()
        assert table.cursor_row == 1
        await pilot.click("#--content-tab-findings")
        assert app.query_one(TabbedContent).active == "findings"


def headline_why(app: IncidentApp) -> str:
    return next(line for line in screen_text(app).splitlines() if "Why:" in line)


async def test_a_report_without_findings_says_so_also_after_r(make_app: MakeApp, synth_report: dict[str, Any]) -> None:
    """An unexplained regression (findings == []) is an answer, not "diagnosing…" forever."""
    app = make_app(report={**synth_report, "findings": []})
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        assert "diagnosing" not in headline_why(app)
        assert "no rule explains the regression" in headline_why(app)
        await pilot.press("r")
        await settle(pilot)
        assert "diagnosing" not in headline_why(app)
        assert "no rule explains the regression" in headline_why(app)
        await pilot.press("f")
        await pilot.pause()
        assert NO_FINDINGS in screen_text(app)
        await pilot.press("c")
        assert "No rule explains the regression." in app.clipboard


class FailingDiagnosis(FixtureReportSource):
    """A real store whose diagnosis fails the first ``failures`` times, then answers."""

    def __init__(self, path: str, report: dict[str, Any], failures: int) -> None:
        super().__init__(path, report)
        self.failures = failures

    def diagnose(self, selection: Selection) -> dict[str, Any]:
        if self.failures > 0:
            self.failures -= 1
            raise SreAgentError("the diagnosis process failed: killed")
        return super().diagnose(selection)


async def test_a_failed_diagnosis_shows_in_the_headline_and_r_retries(
    synth_db: Path, synth_report: dict[str, Any], tmp_path: Path
) -> None:
    app = IncidentApp(FailingDiagnosis(str(synth_db), synth_report, failures=1), export_dir=tmp_path)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(lambda: isinstance(app.screen, ErrorScreen), 60, pilot.pause)
        await pilot.pause()
        await pilot.press("escape")
        await settle(pilot)
        assert "diagnosis failed" in headline_why(app)
        await pilot.press("r")
        await settle(pilot)
        assert f"#1 {synth_report['findings'][0]['cause']}" in headline_why(app)


async def test_the_drill_down_breaks_down_the_headline_metric(make_app: MakeApp, synth_db: Path) -> None:
    """The headline says TTFT: timeline, stages, slices and traces break down TTFT, not e2e."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "What:  TTFT p99" in screen_text(app)
        assert app.metric == "ttft"
        assert "TTFT p99 over time" in screen_text(app)
        await pilot.press("s")
        await pilot.pause()
        assert "≥p99 ttft" in screen_text(app)
        table = app.query_one("#slices-table", DataTable)
        con = duckdb.connect(str(synth_db), read_only=True)
        try:
            expected = explore_slices.slices(
                con, explore.resolve_scope(con, Selection(mode="since_last_deploy")), "ttft"
            )
        finally:
            con.close()
        shown = [tuple(table.get_row_at(i)[:2]) for i in range(table.row_count)]
        assert shown == [(r.dimension, r.value) for r in expected]
        assert table.get_row_at(0)[2] == "yes"  # gpu-3 stands out
        assert all(table.get_row_at(i)[2] == "" for i in range(1, table.row_count))


async def test_where_names_no_slice_when_the_regression_is_everywhere(
    uniform_db: Path, synth_report: dict[str, Any], tmp_path: Path
) -> None:
    app = IncidentApp(FixtureReportSource(str(uniform_db), synth_report), export_dir=tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        where = next(line for line in screen_text(app).splitlines() if "Where:" in line)
        assert "no slice stands out" in where
        assert "=" not in where  # names no dimension=value


async def test_version_dialog_lists_the_versions_present_and_proposes_the_last_two(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("v")
        assert isinstance(app.screen, ComparisonScreen)
        await wait_until(lambda: "versions present (" in screen_text(app), 30, pilot.pause)
        text = screen_text(app)
        assert "v1" in text
        assert "v2" in text
        assert "10,000" in text
        assert app.screen.query_one("#first", Input).value == "v1"
        assert app.screen.query_one("#second", Input).value == "v2"
        await pilot.press("enter", "enter")
        await settle(pilot)
        assert app.selection.mode == "versions"
        assert app.overview is not None
        assert app.overview.scope.label == "versions v1 vs v2"
