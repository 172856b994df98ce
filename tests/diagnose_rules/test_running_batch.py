"""The running batch per request: the packed single-array layout, the per-replica
fallback and a brute-force overlap count agree on a store built from serving mechanics."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from rules_synth import Side, build

from sre_agent.analysis import busy
from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.selection import Selection
from sre_agent.rules import _engine_cost


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("running") / "s.duckdb", Side(), Side(version="v2", rate_rps=12.0))


def _running(path: Path, at: str) -> pl.DataFrame:
    con = duckdb.connect(str(path), read_only=True)
    try:
        comparison = Comparison.open(con, Selection(mode="since_last_deploy"))
        return _engine_cost.running_batch(comparison, at).sort("span_id")  # type: ignore[arg-type]
    finally:
        con.close()


@pytest.mark.parametrize("at", ["prefill", "decode"])
def test_packed_and_per_replica_layouts_agree(store: Path, at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    packed = _running(store, at)
    # A horizon of ~2**61 ns leaves no bits for the replica code: the per-replica arrays are used.
    monkeypatch.setattr(busy, "HORIZON_NS", 2**61)
    per_replica = _running(store, at)
    assert packed.height > 100
    assert packed.equals(per_replica)


def test_running_at_scheduling_matches_a_brute_force_overlap_count(store: Path) -> None:
    con = duckdb.connect(str(store), read_only=True)
    try:
        rows = con.sql(
            "SELECT span_id, coalesce(service_instance, host_name, service_name, '') AS replica, "
            "start_ns + CAST(coalesce(queue_s, 0) * 1e9 AS BIGINT) AS sched, "
            "start_ns + CAST(e2e_s * 1e9 AS BIGINT) AS fin FROM spans WHERE is_engine AND e2e_s IS NOT NULL"
        ).pl()
    finally:
        con.close()
    running = _running(store, "prefill").join(rows, on="span_id")
    sample = running.sample(200, seed=1)
    for r in sample.iter_rows(named=True):
        same = rows.filter(pl.col("replica") == r["replica"])
        t = r["sched"]
        expected = int(((same["sched"] <= t) & (same["fin"] > t)).sum())
        assert r["running"] == float(max(expected, 1)), r
    assert np.mean(running["running"].to_numpy()) > 1.0


def test_running_during_decode_matches_a_brute_force_overlap_count(store: Path) -> None:
    # Decode moments spread over each request's life: the intervals kept around them must
    # still give the exact count at every one of them, over the selected spans (both windows).
    con = duckdb.connect(str(store), read_only=True)
    try:
        comparison = Comparison.open(con, Selection(mode="since_last_deploy"))
        rows = con.sql(
            comparison.scan_sql(
                "coalesce(service_instance, host_name, service_name, '') AS replica, "
                "start_ns + CAST(coalesce(queue_s, 0) * 1e9 AS BIGINT) AS sched, "
                "start_ns + CAST(e2e_s * 1e9 AS BIGINT) AS fin",
                "e2e_s IS NOT NULL",
            )
        ).pl()
        sample, fractions = busy.moments(comparison.requests, "decode")
        running = _engine_cost.running_batch(comparison, "decode")
    finally:
        con.close()
    checked = sample.join(running, on="span_id").sort("span_id").sample(150, seed=2)
    for r in checked.iter_rows(named=True):
        same = rows.filter(pl.col("replica") == r["replica"])
        counts = []
        for f in fractions:
            t = r["_from"] + int(r["_span"] * f)
            counts.append(int(((same["sched"] <= t) & (same["fin"] > t)).sum()))
        assert r["running"] == pytest.approx(max(float(np.mean(counts)), 1.0)), r


def test_running_at_refuses_a_time_away_from_every_moment(store: Path) -> None:
    con = duckdb.connect(str(store), read_only=True)
    try:
        comparison = Comparison.open(con, Selection(mode="since_last_deploy"))
        intervals = comparison.busy_intervals
        sample, _ = busy.moments(comparison.requests, "prefill")
    finally:
        con.close()
    replica = sample["replica"][0]
    at_moment = sample["_from"].to_numpy()[:5]
    assert intervals.running_at(replica, at_moment).min() >= 1
    # A full day after the windows: no sampled request lives there, so its intervals were dropped.
    later = np.array([comparison.bounds[1] + 86_400 * 10**9 // 2], dtype=np.int64)
    with pytest.raises(ValueError, match="moments"):
        intervals.running_at(replica, later)


def test_the_background_read_matches_the_direct_read(store: Path) -> None:
    con = duckdb.connect(str(store), read_only=True)
    try:
        comparison = Comparison.open(con, Selection(mode="since_last_deploy"))
        assert comparison.start_prefetch()
        background = comparison.busy_intervals
        direct = busy.fetch_busy_intervals(comparison, con)
    finally:
        con.close()
    assert len(background.starts) > 100
    assert len(background.codes) > 1
    assert background.codes == direct.codes
    assert np.array_equal(background.starts, direct.starts)
    assert np.array_equal(background.ends, direct.ends)


def test_no_background_read_around_a_tenant_view_of_spans(store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(store.read_bytes())
    con = duckdb.connect(str(copy))
    try:
        # The server scopes a tenant token this way; a second connection would not see the view.
        con.execute("CREATE TEMP VIEW spans AS SELECT * FROM copy.main.spans WHERE service_instance <> 'gpu-1'")
        comparison = Comparison.open(con, Selection(mode="since_last_deploy"))
        assert not comparison.start_prefetch()
        scoped = comparison.busy_intervals
        total = con.sql("SELECT count(*) FROM copy.main.spans WHERE is_engine AND e2e_s IS NOT NULL").fetchall()[0]
    finally:
        con.close()
    assert "gpu-1" not in scoped.codes
    assert total is not None
    assert 0 < len(scoped.starts) < total[0]
