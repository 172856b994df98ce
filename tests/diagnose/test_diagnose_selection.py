"""Selection resolution: every mode, filters, and clear errors for selections without data."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest

from sre_agent.analysis import explore
from sre_agent.analysis.compare import Comparison, DeployPoint, resolve_windows
from sre_agent.analysis.selection import Selection, Window
from sre_agent.errors import InsufficientDataError, SelectionError

NS = 1_000_000_000


@pytest.fixture(scope="module")
def store(make_store) -> tuple[Path, int]:  # type: ignore[no-untyped-def]
    return make_store("none")  # type: ignore[no-any-return]


def _open(path: Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(path), read_only=True)


def test_deploy_at_default_windows_are_equal_and_capped_by_the_data(store: tuple[Path, int]) -> None:
    path, deploy = store
    with _open(path) as con:
        c = Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy))
        b, k = c.window("baseline"), c.window("candidate")
    assert b.end_ns == k.start_ns == deploy
    assert b.seconds == pytest.approx(k.seconds)
    assert 290 < b.seconds <= 300
    assert b.requests > 1000
    assert k.requests > 1000


def test_deploy_at_with_explicit_window(store: tuple[Path, int]) -> None:
    path, deploy = store
    with _open(path) as con:
        c = Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy, window_ns=60 * NS))
        assert c.window("baseline").seconds == 60
        assert c.window("candidate").start_ns == deploy
        full = Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy))
        assert c.request_counts["candidate"] < full.request_counts["candidate"] / 3


def test_versions_mode_selects_by_service_version(store: tuple[Path, int]) -> None:
    path, _ = store
    with _open(path) as con:
        c = Comparison.open(con, Selection(mode="versions", baseline_version="v1", candidate_version="v2"))
        versions = c.requests.group_by("side").agg(pl.col("service_version").unique().alias("v")).to_dicts()
        assert {r["side"]: r["v"] for r in versions} == {"baseline": ["v1"], "candidate": ["v2"]}
        with pytest.raises(SelectionError, match=r"v9.*versions present: v1, v2"):
            Comparison.open(con, Selection(mode="versions", baseline_version="v1", candidate_version="v9"))


def test_explicit_windows(store: tuple[Path, int]) -> None:
    path, deploy = store
    sel = Selection(
        mode="windows",
        baseline=Window(deploy - 100 * NS, deploy - 50 * NS),
        candidate=Window(deploy + 50 * NS, deploy + 100 * NS),
    )
    with _open(path) as con:
        c = Comparison.open(con, sel)
        starts = c.requests.group_by("side").agg(pl.col("start_ns").min().alias("lo")).to_dicts()
    lo = {r["side"]: r["lo"] for r in starts}
    assert lo["baseline"] >= deploy - 100 * NS
    assert lo["candidate"] >= deploy + 50 * NS


def test_since_last_deploy_uses_the_marker_then_the_version_change(store: tuple[Path, int], tmp_path: Path) -> None:
    path, deploy = store
    with _open(path) as con:
        _b, c, notes, deploy_point = resolve_windows(con, Selection(mode="since_last_deploy"))
    assert c.start_ns == deploy
    assert "deploy marker" in notes[0]
    assert deploy_point is not None
    assert deploy_point.time_ns == deploy
    # Without a marker, the first span of the newest service.version is the deploy.
    copy = tmp_path / "nomarker.duckdb"
    copy.write_bytes(path.read_bytes())
    with duckdb.connect(str(copy)) as con:
        con.execute("DELETE FROM deploys")
        first_v2 = con.execute("SELECT min(start_ns) FROM spans WHERE service_version = 'v2'").fetchall()[0][0]
        _, c2, notes2, found = resolve_windows(con, Selection(mode="since_last_deploy"))
        assert c2.start_ns == first_v2
        assert "service.version change" in notes2[0]
        assert found == DeployPoint(first_v2, "v2", "v1")
        con.execute("UPDATE span_rows SET service_version = 'v1'")
        with pytest.raises(SelectionError, match=r"no deploy marker and no service\.version change"):
            resolve_windows(con, Selection(mode="since_last_deploy"))


def test_filters_on_canonical_columns_and_attribute_maps(store: tuple[Path, int]) -> None:
    path, deploy = store
    with _open(path) as con:
        host = Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy, where=(("host.name", "gpu-1"),)))
        assert set(host.requests["host_name"].unique()) == {"gpu-1"}
        tenant = Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy, where=(("tenant.id", "acme"),)))
        assert tenant.request_counts["baseline"] < host.request_counts["baseline"] * 3
        assert "tenant.id" not in tenant.dimensions  # one value left after the filter
        service = Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy, service="vllm"))
        assert (
            service.request_counts
            == Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy)).request_counts
        )
        with pytest.raises(SelectionError):
            Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy, service="nope"))


def test_selection_without_data_says_why(store: tuple[Path, int]) -> None:
    path, deploy = store
    with _open(path) as con:
        with pytest.raises(SelectionError, match="no engine requests after the deploy"):
            Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy + 10_000 * NS))
        far = Selection(mode="windows", baseline=Window(1, 2 * NS), candidate=Window(3 * NS, 4 * NS))
        with pytest.raises(InsufficientDataError, match="no engine requests and no latency metrics"):
            Comparison.open(con, far)


def test_a_where_filter_narrows_the_populations_not_the_windows(store: tuple[Path, int]) -> None:
    path, _ = store
    with _open(path) as con:
        # The host whose first request came last: sizing windows by its own extent would shift them.
        host, first = con.execute(
            "SELECT host_name, min(start_ns) FROM spans WHERE is_engine GROUP BY 1 ORDER BY 2 DESC LIMIT 1"
        ).fetchall()[0]
        overall_first = con.execute("SELECT min(start_ns) FROM spans WHERE is_engine").fetchall()[0][0]
        assert first > overall_first
        everything = Selection(mode="since_last_deploy")
        narrowed = Selection(mode="since_last_deploy", where=(("host_name", host),))
        plain, sliced = resolve_windows(con, everything), resolve_windows(con, narrowed)
        assert (sliced.baseline, sliced.candidate, sliced.deploy) == (plain.baseline, plain.candidate, plain.deploy)
        scope = explore.resolve_scope(con, narrowed)
        assert (scope.baseline.start_ns, scope.baseline.end_ns) == (plain.baseline.start_ns, plain.baseline.end_ns)
        assert (scope.candidate.start_ns, scope.candidate.end_ns) == (plain.candidate.start_ns, plain.candidate.end_ns)
        assert plain.deploy is not None
        assert scope.deploy_ns == plain.deploy.time_ns
        whole, part = Comparison.open(con, everything), Comparison.open(con, narrowed)
        assert 0 < part.window("candidate").requests < whole.window("candidate").requests
