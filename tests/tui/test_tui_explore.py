"""The console's queries (sre_agent.analysis.explore) on the synthetic incident, checked against plain computations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest
from tui_synth import DEPLOY_NS, HOUR_NS, T0_NS, build_store

from sre_agent.analysis import explore, explore_slices
from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.selection import Selection, Window
from sre_agent.api import explore_routes as explore_api
from sre_agent.errors import SelectionError

SINCE = Selection(mode="since_last_deploy")


@pytest.fixture
def con(synth_db: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect(str(synth_db), read_only=True)
    yield connection
    connection.close()


def column(con: duckdb.DuckDBPyConnection, name: str, start_ns: int, end_ns: int) -> np.ndarray:
    rows = con.execute(
        f"SELECT {name} FROM spans WHERE is_engine AND start_ns >= ? AND start_ns < ?", [start_ns, end_ns]
    ).fetchall()
    return np.array([r[0] for r in rows], dtype=float)


def test_since_last_deploy_uses_the_marker_with_equal_sides(con: duckdb.DuckDBPyConnection) -> None:
    scope = explore.resolve_scope(con, SINCE)
    assert scope.deploy_ns == DEPLOY_NS
    assert scope.label == "deploy v2 at 2026-05-28T20:56:40.000Z (after v1)"
    assert scope.candidate.start_ns == scope.baseline.end_ns == DEPLOY_NS
    assert scope.candidate.end_ns - DEPLOY_NS == DEPLOY_NS - scope.baseline.start_ns


def test_without_markers_the_latest_version_change_is_the_deploy(tmp_path: Path) -> None:
    db = build_store(tmp_path / "nomarker.duckdb", n_requests=3_000)
    with duckdb.connect(str(db)) as rw:
        rw.execute("DELETE FROM deploys")
    with duckdb.connect(str(db), read_only=True) as ro:
        scope = explore.resolve_scope(ro, SINCE)
    first_v2 = scope.deploy_ns
    assert first_v2 is not None
    assert DEPLOY_NS <= first_v2 < DEPLOY_NS + 60 * 10**9
    assert "deploy v2" in scope.label


def test_other_selections_resolve_to_their_populations(con: duckdb.DuckDBPyConnection) -> None:
    versions = explore.resolve_scope(con, Selection(mode="versions", baseline_version="v1", candidate_version="v2"))
    assert (versions.baseline.version, versions.candidate.version) == ("v1", "v2")
    assert versions.label == "versions v1 vs v2"
    base, cand = Window(T0_NS, T0_NS + 600 * 10**9), Window(DEPLOY_NS, DEPLOY_NS + 600 * 10**9)
    windows = explore.resolve_scope(con, Selection(mode="windows", baseline=base, candidate=cand))
    assert (windows.baseline.start_ns, windows.candidate.end_ns) == (base.start_ns, cand.end_ns)
    at = explore.resolve_scope(con, Selection(mode="deploy_at", deploy_at_ns=DEPLOY_NS, window_ns=300 * 10**9))
    assert at.baseline.start_ns == DEPLOY_NS - 300 * 10**9
    with pytest.raises(SelectionError):
        explore.resolve_scope(con, Selection(mode="deploy_at", deploy_at_ns=T0_NS + 2 * HOUR_NS))


def test_overview_quantiles_rates_and_status(con: duckdb.DuckDBPyConnection) -> None:
    scope = explore.resolve_scope(con, SINCE)
    ov = explore.overview(con, scope)
    tiles = {t.metric: t for t in ov.tiles}
    assert list(tiles) == ["ttft", "tpot", "e2e", "queue"]
    for metric, col in (("ttft", "ttft_s"), ("e2e", "e2e_s"), ("queue", "queue_s")):
        before = column(con, col, scope.baseline.start_ns, scope.baseline.end_ns)
        after = column(con, col, scope.candidate.start_ns, scope.candidate.end_ns)
        assert tiles[metric].p99_baseline == pytest.approx(np.quantile(before, 0.99))
        assert tiles[metric].p99_candidate == pytest.approx(np.quantile(after, 0.99))
        assert tiles[metric].p50_candidate == pytest.approx(np.quantile(after, 0.5))
    assert tiles["ttft"].status == "breach"  # 13 s against a 2 s target
    assert tiles["e2e"].status == "regressed"  # more than 20 % worse, inside its 30 s target
    assert tiles["tpot"].status == "ok"
    assert 19_998 <= ov.requests_baseline + ov.requests_candidate <= 20_000  # equal widths trim an edge
    assert ov.rate_candidate == pytest.approx(ov.requests_candidate / scope.candidate.seconds)
    assert ov.error_rate_candidate == pytest.approx(0.005, abs=0.002)
    assert ov.goodput_candidate < ov.goodput_baseline  # gpu-3 misses the TTFT target after the deploy
    relaxed = explore.overview(con, scope, {"ttft": 60.0})
    assert relaxed.tiles[0].status == "regressed"
    assert relaxed.goodput_candidate > ov.goodput_candidate


def test_timeline_marks_the_deploy_and_the_jump(con: duckdb.DuckDBPyConnection) -> None:
    scope = explore.resolve_scope(con, SINCE)
    tl = explore.timeline(con, scope, "ttft", buckets=20)
    assert [d.version for d in tl.deploys] == ["v2"]
    marker = tl.deploys[0].bucket
    assert marker in (9, 10)
    series = tl.series["all"]
    assert len(series) == 20
    assert sum(tl.counts) == 20_000 - 1  # the very last request sits on the open end of the window
    before = [v for v in series[:marker] if v is not None]
    after = [v for v in series[marker + 1 :] if v is not None]
    assert max(before) < 2.0 < min(after)


def test_slices_put_the_broken_host_first(con: duckdb.DuckDBPyConnection, quiet_db: Path) -> None:
    rows = explore_slices.slices(con, explore.resolve_scope(con, SINCE))
    top = rows[0]
    assert (top.dimension, top.value) == ("host_name", "gpu-3")
    assert top.contribution is not None
    assert top.contribution > 0.95
    assert top.slow_share_candidate is not None
    assert top.slow_share_candidate > 0.5
    assert {r.dimension for r in rows} >= {"host_name", "model", "tenant_id", "http.route"}
    others = [r for r in rows if r.dimension == "host_name" and r.value != "gpu-3"]
    assert all((r.contribution or 0) < 0.05 for r in others)
    with duckdb.connect(str(quiet_db), read_only=True) as quiet:
        calm = explore_slices.slices(quiet, explore.resolve_scope(quiet, SINCE))
    assert all(abs(r.excess_slow) < 30 for r in calm)


def test_only_a_slice_whose_tail_grew_more_than_the_rest_stands_out(
    con: duckdb.DuckDBPyConnection, uniform_db: Path
) -> None:
    scope = explore.resolve_scope(con, SINCE)
    for metric in ("ttft", "e2e"):
        rows = explore_slices.slices(con, scope, metric)
        assert [(r.dimension, r.value) for r in rows if r.stands_out] == [("host_name", "gpu-3")]
        assert rows[0].stands_out
        assert rows[0].z is not None
        assert rows[0].z > 10
    with duckdb.connect(str(uniform_db), read_only=True) as uniform:
        rows = explore_slices.slices(uniform, explore.resolve_scope(uniform, SINCE), "ttft")
    tenants = [r for r in rows if r.dimension == "tenant_id"]
    # A random half holds about half of the excess: a large share, and no location.
    assert len(tenants) == 2
    assert all(r.contribution is not None and 0.4 < r.contribution < 0.6 for r in tenants)
    assert not any(r.stands_out for r in rows)
    assert all(r.z is not None and abs(r.z) < 3 for r in rows)


def test_rise_against_rest_is_a_difference_in_differences() -> None:
    # Slice 10% -> 30% slow, rest 10% -> 10%: +20 points against 0.
    z = explore_slices._rise_against_rest((1000, 1000, 100, 300), (3000, 3000, 300, 300))
    assert z is not None
    assert z > 8
    # The same rise everywhere is no difference at all.
    same = explore_slices._rise_against_rest((1000, 1000, 100, 300), (3000, 3000, 300, 900))
    assert same is not None
    assert abs(same) < 1e-9
    # A slice new in the candidate is compared on the candidate side alone.
    new = explore_slices._rise_against_rest((0, 500, 0, 50), (3000, 3000, 300, 300))
    assert new is not None
    assert abs(new) < 1e-9
    assert explore_slices._rise_against_rest((10, 0, 1, 0), (3000, 3000, 300, 300)) is None


def test_versions_lists_each_version_with_its_requests(con: duckdb.DuckDBPyConnection) -> None:
    found = explore.versions(con)
    assert [(v.service, v.version, v.requests) for v in found] == [("vllm", "v1", 10_000), ("vllm", "v2", 10_000)]
    assert found[0].first < found[0].last <= found[1].first
    assert found[1].first.startswith("2026-05-28T20:56:4")
    assert explore.versions(con, service="gateway") == []


def test_filters_narrow_every_query(con: duckdb.DuckDBPyConnection) -> None:
    scope = explore.resolve_scope(con, SINCE)
    on_gpu3 = scope.narrowed("host_name", "gpu-3")
    assert explore.overview(con, on_gpu3).requests_candidate == 2_500
    by_route = scope.narrowed("http.route", "/v1/completions")  # an attribute key, not a column
    total = explore.overview(con, by_route)
    assert 0.2 < total.requests_candidate / 10_000 < 0.3
    assert on_gpu3.narrowed("host_name", "gpu-1").where == (("host_name", "gpu-1"),)
    assert on_gpu3.widened().where == ()
    # The attribute spelling of a resolved column filters alike, and so does the diagnosis's filter.
    by_key = explore.overview(con, scope.narrowed("host.name", "gpu-3"))
    assert by_key.requests_candidate == 2_500
    with_where = Comparison.open(con, Selection(mode="since_last_deploy", where=(("host.name", "gpu-3"),)))
    assert with_where.window("candidate").requests == 2_500


def test_stage_breakdown_blames_prefill(con: duckdb.DuckDBPyConnection) -> None:
    sb = explore.stage_breakdown(con, explore.resolve_scope(con, SINCE))
    change = {stage: sb.candidate[stage] - sb.baseline[stage] for stage in explore.STAGES}
    assert max(change, key=lambda s: change[s]) == "prefill"
    assert change["prefill"] > 5.0
    assert sb.tail_requests_candidate == 100
    # the synthetic gateway adds exactly 10 ms around retrieval (20-50 ms) and the engine
    assert sb.candidate["gateway"] == pytest.approx(0.01, abs=1e-3)
    assert 0.02 < sb.candidate["dependency"] < 0.05


def test_exemplars_and_their_waterfall(con: duckdb.DuckDBPyConnection) -> None:
    scope = explore.resolve_scope(con, SINCE)
    exemplars = explore.exemplars(con, scope, per_side=3)
    assert [e.side for e in exemplars] == ["baseline"] * 3 + ["candidate"] * 3
    cand = [e.e2e_s for e in exemplars if e.side == "candidate"]
    assert cand == sorted(cand, reverse=True)
    slowest = column(con, "e2e_s", scope.candidate.start_ns, scope.candidate.end_ns).max()
    assert cand[0] == pytest.approx(slowest)
    trace = exemplars[3]
    spans = explore.waterfall(con, trace.trace_id, trace.start_ns)
    assert [(s.depth, s.name) for s in spans] == [(0, spans[0].name), (1, "retrieval"), (1, "llm_request")]
    assert spans[0].offset_s == 0.0
    assert spans[2].is_engine
    assert spans[2].offset_s == pytest.approx(spans[1].offset_s + spans[1].duration_s, abs=1e-6)
    assert explore.waterfall(con, "0" * 32) == []


def test_json_and_query_forms_round_trip(con: duckdb.DuckDBPyConnection) -> None:
    scope = explore.resolve_scope(con, SINCE)
    for value, cls in (
        (explore.overview(con, scope), explore.Overview),
        (explore.timeline(con, scope), explore.Timeline),
        (explore.stage_breakdown(con, scope), explore.StageBreakdown),
    ):
        assert explore_api.from_json_dict(cls, explore_api.to_json_dict(value)) == value
    selection = Selection(
        mode="deploy_at", deploy_at_ns=DEPLOY_NS, window_ns=600 * 10**9, where=(("host_name", "gpu-3"),)
    )
    assert explore_api.selection_from_query(explore_api.selection_to_query(selection)) == selection
    with pytest.raises(SelectionError):
        explore.timeline(con, scope, "nope")
