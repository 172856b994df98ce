"""The metric stream's own estimates: quantile intervals from buckets and replicas that served.

Intervals are checked against their definition (coverage of a known quantile over many
draws) and their edges (+Inf bucket); replicas are read from a real DuckDB store holding
cumulative histogram points as the receiver writes them.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sre_agent.analysis.metric_view import HistogramDelta, MetricView
from sre_agent.analysis.resolve import SideWindow
from sre_agent.analysis.selection import Selection
from sre_agent.rules._load import cap_binds
from sre_agent.rules._steps import metric_step
from sre_agent.store import schema

BOUNDS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


def _bucketed(values: np.ndarray) -> HistogramDelta:
    counts = np.bincount(np.searchsorted(BOUNDS, values, side="left"), minlength=len(BOUNDS) + 1)
    return HistogramDelta(BOUNDS, tuple(int(c) for c in counts), float(values.sum()))


def test_quantile_interval_covers_the_true_quantile_as_often_as_it_claims() -> None:
    # Log-normal latencies (median 0.5 s): the true p90 is exp(ln 0.5 + 1.2816 sigma). A 95 %
    # interval read through buckets is at least as wide as the order-statistic one, so it must
    # cover the truth in >= 95 % of 400 draws of 700 requests (a p90 of ~70 values); with
    # interpolation inside the bucket it covered 86 %.
    rng = np.random.default_rng(7)
    sigma, q = 0.6, 0.9
    truth = math.exp(math.log(0.5) + 1.2816 * sigma)
    covered = 0
    for _ in range(400):
        interval = _bucketed(rng.lognormal(math.log(0.5), sigma, 700)).quantile_interval(q)
        assert interval is not None
        covered += interval[0] <= truth <= interval[1]
    assert covered / 400 >= 0.95, covered


FINE_BOUNDS = tuple(float(b) for b in np.geomspace(0.01, 5.0, 120))


def _token_blocks(rng: np.random.Generator, blocks: int = 40, per_block: int = 5, tokens: int = 100) -> HistogramDelta:
    """Inter-token latencies of requests that each decode at their own speed, one block per scrape."""
    rows = []
    for _ in range(blocks):
        speed = rng.lognormal(math.log(0.2), 0.5, per_block)  # seconds per token, per request
        itl = (speed[:, None] * rng.lognormal(0.0, 0.1, (per_block, tokens))).ravel()
        rows.append(np.bincount(np.searchsorted(FINE_BOUNDS, itl, side="left"), minlength=len(FINE_BOUNDS) + 1))
    total = np.sum(rows, axis=0)
    return HistogramDelta(FINE_BOUNDS, tuple(int(c) for c in total), 0.0, tuple(tuple(int(c) for c in r) for r in rows))


def test_tokens_of_one_request_count_as_one_request_in_the_interval() -> None:
    # The ITL histogram observes every output token, but a request's tokens share its decode
    # speed (its batch, its context length): 20,000 tokens from 200 requests are worth about 200
    # independent observations, not 20,000. Counted as independent, a 95 % interval for the p90
    # covers the true p90 in about 60 % of the draws, which is how healthy deploys got flagged;
    # the design effect measured between scrape blocks restores the coverage.
    rng = np.random.default_rng(11)
    q = 0.9
    population = _token_blocks(rng, blocks=4000)
    truth = population.quantile(q)
    assert truth is not None
    # The truth is only known to its bucket (1/20 of an octave wide): an interval covers it when
    # it overlaps that bucket.
    lo_edge = max((b for b in FINE_BOUNDS if b < truth), default=0.0)
    hi_edge = min((b for b in FINE_BOUNDS if b >= truth), default=math.inf)
    naive = widened = 0
    draws = 200
    for _ in range(draws):
        hist = _token_blocks(rng)
        assert hist.count == 20_000
        effective = hist.independent(q)
        assert effective < hist.count / 20  # about one per request, not one per token
        for interval, counter in (
            (hist.quantile_interval(q, independent=hist.count), "naive"),
            (hist.quantile_interval(q), "widened"),
        ):
            assert interval is not None
            hit = interval[0] < hi_edge and interval[1] > lo_edge
            if counter == "naive":
                naive += hit
            else:
                widened += hit
    assert widened / draws >= 0.95, widened
    assert naive / draws < 0.8, naive  # 117 of 200 with this seed


def test_independent_observations_keep_their_count() -> None:
    # No shared fate: every token its own draw. The design effect stays near 1, so the interval
    # does not widen for nothing (the estimate is noisy: within a factor of two).
    rng = np.random.default_rng(5)
    rows = [np.bincount(np.searchsorted(BOUNDS, rng.lognormal(math.log(0.2), 0.5, 500), side="left"),
                        minlength=len(BOUNDS) + 1) for _ in range(40)]  # fmt: skip
    total = np.sum(rows, axis=0)
    hist = HistogramDelta(BOUNDS, tuple(int(c) for c in total), 0.0, tuple(tuple(int(c) for c in r) for r in rows))
    assert hist.count / 2 <= hist.independent(0.9) <= hist.count
    assert HistogramDelta(BOUNDS, tuple(int(c) for c in total), 0.0).independent(0.9) == hist.count  # no blocks


def test_a_tail_with_nothing_above_its_bucket_still_measures_its_clustering() -> None:
    # A p99 often sits in the last bucket a side reached: no observation lies above it, and the
    # share above the bucket (0) cannot say whether the tail came in bursts. Here 2 % of 10,000
    # observations (in 0.5-0.8 s) arrived in 2 of 20 scrape blocks: the p99 rests on about as many
    # independent observations as there are blocks, not 10,000, and its interval must be wide.
    rows = [[500, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] for _ in range(20)]
    for burst in (3, 11):
        rows[burst] = [400, 0, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0]
    total = tuple(int(c) for c in np.sum(rows, axis=0))
    hist = HistogramDelta(BOUNDS, total, 0.0, tuple(tuple(r) for r in rows))
    assert hist.count == 10_000
    assert hist.independent(0.99) < hist.count / 20
    interval = hist.quantile_interval(0.99)
    assert interval is not None
    assert interval[0] <= 0.05  # reaches down to the bulk: two bursts do not pin the p99
    # Spread evenly over the blocks, the same tail counts (nearly) every observation.
    even = [[490, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0] for _ in range(20)]
    spread = HistogramDelta(BOUNDS, tuple(int(c) for c in np.sum(even, axis=0)), 0.0, tuple(tuple(r) for r in even))
    assert spread.independent(0.99) >= spread.count / 2
    assert spread.quantile_interval(0.99) == (0.5, 0.8)


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(min_value=0, max_value=500), min_size=len(BOUNDS) + 1, max_size=len(BOUNDS) + 1),
    q=st.sampled_from([0.5, 0.9, 0.99]),
)
def test_quantile_interval_brackets_the_quantile(counts: list[int], q: float) -> None:
    hist = HistogramDelta(BOUNDS, tuple(counts), 0.0)
    interval, point = hist.quantile_interval(q), hist.quantile(q)
    if sum(counts) == 0:
        assert interval is None
        assert point is None
        return
    assert interval is not None
    assert point is not None
    assert interval[0] <= point + 1e-12
    assert point <= interval[1] + 1e-12
    upper_rank = min(sum(counts), sum(counts) * q + 1.96 * math.sqrt(sum(counts) * q * (1 - q)))
    if counts[-1] and upper_rank > sum(counts) - counts[-1]:
        # The upper rank lies among the +Inf bucket's observations: no finite bound is known.
        assert interval[1] == math.inf


def _store(
    path: Path, served_until_s: dict[str, float], idle_s: tuple[float, float] = (0.0, 0.0)
) -> duckdb.DuckDBPyConnection:
    """A cumulative e2e histogram per replica scraped every 15 s over 600 s (deploy at 300 s).

    No request finishes anywhere during ``idle_s`` (a gap in the traffic).
    """
    rng = random.Random(3)
    rows = []
    for instance, until in served_until_s.items():
        total = 0
        for k in range(41):
            t = 15.0 * k
            if 0 < t <= until and not idle_s[0] < t <= idle_s[1]:
                total += rng.randint(3, 8)  # finished requests since the last scrape
            counts = [0] * (len(BOUNDS) + 1)
            counts[3] = total
            rows.append(
                {"name": "vllm:e2e_request_latency_seconds", "kind": "histogram", "time_ns": int(t * 1e9),
                 "start_time_ns": 0, "temporality": "cumulative", "count": total, "sum": 0.25 * total,
                 "bounds": list(BOUNDS), "bucket_counts": counts, "service_name": "vllm",
                 "service_instance": instance, "host_name": instance, "series_key": f"e2e|{instance}"}
            )  # fmt: skip
    return _points(path, rows)


def _points(path: Path, rows: list[dict[str, Any]]) -> duckdb.DuckDBPyConnection:
    """A store at ``path`` whose ``metric_points`` are ``rows``."""
    con = duckdb.connect(str(path))
    con.execute(schema.METRIC_POINTS_DDL)
    con.register("new_points", pa.Table.from_pylist(rows, schema=schema.metric_points_arrow_schema()))
    con.execute("INSERT INTO metric_points SELECT * FROM new_points")
    return con


def _view(con: duckdb.DuckDBPyConnection) -> MetricView:
    baseline = SideWindow("baseline", 0, 300_000_000_000)
    candidate = SideWindow("candidate", 300_000_000_000, 600_000_000_000)
    return MetricView(con, baseline, candidate, Selection(mode="deploy_at", deploy_at_ns=300_000_000_000))


def test_a_removed_replica_that_keeps_exporting_frozen_counters_is_not_capacity(tmp_path: Path) -> None:
    # replica-3 stops serving 15 s after the deploy but keeps exporting its cumulative histogram
    # (a drained pod, or an exporter that outlives the engine); it served ~5 % of the candidate window.
    con = _store(tmp_path / "m.duckdb", {"replica-1": 600, "replica-2": 600, "replica-3": 315})
    view = _view(con)
    reporting = view.series_count("e2e_seconds")
    assert (reporting.baseline, reporting.candidate) == (3.0, 3.0)  # every instance still reports
    serving = view.serving_replicas()
    assert serving.baseline == pytest.approx(3.0, abs=0.15)
    assert serving.candidate == pytest.approx(2.05, abs=0.1)


def test_serving_replicas_counts_replicas_that_served_all_window_fully(tmp_path: Path) -> None:
    con = _store(tmp_path / "m.duckdb", {"replica-1": 600, "replica-2": 600})
    serving = _view(con).serving_replicas()
    assert serving.baseline == pytest.approx(2.0, abs=0.15)
    assert serving.candidate == pytest.approx(2.0, abs=0.15)


def test_a_gap_in_the_traffic_is_not_a_gap_in_the_replicas(tmp_path: Path) -> None:
    # Bursty traffic: nothing finishes anywhere for the last 135 s of the baseline. Both replicas
    # served whenever anything was served; before, each counted for the ~half of the window in
    # which it finished requests, the baseline had ~1 replica, and a 2x decode slowdown at the
    # same load per replica read as load per replica falling by half (1050031).
    con = _store(tmp_path / "m.duckdb", {"replica-1": 600, "replica-2": 600}, idle_s=(165.0, 300.0))
    serving = _view(con).serving_replicas()
    assert serving.baseline == pytest.approx(2.0, abs=0.15)
    assert serving.candidate == pytest.approx(2.0, abs=0.15)


def test_running_per_replica_is_not_diluted_by_replicas_removed_at_the_deploy(tmp_path: Path) -> None:
    # Four replicas run 3 requests each before the deploy; two are removed at it and keep
    # exporting a running gauge of 0, the two left run 6 each. Scrapes are not aligned across
    # replicas. The plain gauge mean reads 3 -> 3; per serving replica it is 3 -> 6.
    rows = []
    for k, host in enumerate(("replica-1", "replica-2", "replica-3", "replica-4")):
        removed = host in ("replica-3", "replica-4")
        for i in range(40):
            t = 15.0 * i + 2.0 * k  # each replica scraped at its own offset
            running = 3.0 if t < 300 else (0.0 if removed else 6.0)
            rows.append({"name": "vllm:num_requests_running", "kind": "gauge", "time_ns": int(t * 1e9),
                         "value": running, "service_name": "vllm", "service_instance": host, "host_name": host,
                         "series_key": f"run|{host}"})  # fmt: skip
            done = i if t < 300 or not removed else 20  # finished-request count: removed ones stop
            rows.append({"name": "vllm:e2e_request_latency_seconds", "kind": "histogram", "time_ns": int(t * 1e9),
                         "start_time_ns": 0, "temporality": "cumulative", "count": done, "sum": 0.25 * done,
                         "bounds": list(BOUNDS), "bucket_counts": [0, 0, 0, done] + [0] * (len(BOUNDS) - 3),
                         "service_name": "vllm", "service_instance": host, "host_name": host,
                         "series_key": f"e2e|{host}"})  # fmt: skip
    view = _view(_points(tmp_path / "m.duckdb", rows))
    plain = view.gauge("running_requests")
    assert plain.candidate == pytest.approx(3.0, abs=0.2)
    running = view.running_per_replica()
    assert running.baseline == pytest.approx(3.0, abs=0.2)
    assert running.candidate == pytest.approx(6.0, abs=0.6)


def test_histogram_by_replica_adds_each_replicas_increments_across_a_reset(tmp_path: Path) -> None:
    # Cumulative ITL histograms of two replicas scraped every 60 s; replica-2 restarts in the
    # candidate window (its count falls), which adds the count it restarted with.
    cumulative = {
        "replica-1": [(0, 0), (60, 100), (120, 200), (180, 300), (240, 400), (300, 500), (360, 600), (420, 700)],
        "replica-2": [(0, 0), (60, 50), (120, 100), (180, 150), (240, 200), (300, 250), (360, 20), (420, 70)],
    }
    mean_s = {"replica-1": 0.02, "replica-2": 0.05}
    rows = [
        {"name": "vllm:inter_token_latency_seconds", "kind": "histogram", "time_ns": int(t * 1e9),
         "start_time_ns": 0, "temporality": "cumulative", "count": n, "sum": mean_s[host] * n,
         "bounds": list(BOUNDS), "bucket_counts": [0, n] + [0] * (len(BOUNDS) - 1), "service_name": "vllm",
         "service_instance": host, "host_name": host, "series_key": f"itl|{host}"}
        for host, points in cumulative.items()
        for t, n in points
    ]  # fmt: skip
    view = _view(_points(tmp_path / "m.duckdb", rows))
    base = view.histogram_by_replica("itl_seconds", "baseline")
    cand = view.histogram_by_replica("itl_seconds", "candidate")
    # Baseline [0, 300 s): points 0-240 s, the first adds nothing.
    assert base[("host.name", "replica-1")] == pytest.approx((0.02 * 400, 400))
    assert base[("host.name", "replica-2")] == pytest.approx((0.05 * 200, 200))
    # Candidate [300, 600 s): the first point (300 s) adds nothing; replica-2 resets at 360 s to 20.
    assert cand[("host.name", "replica-1")] == pytest.approx((0.02 * 200, 200))
    assert cand[("host.name", "replica-2")] == pytest.approx((0.05 * 70, 70))


def _gauges(path: Path, candidate: list[tuple[float, float]]) -> MetricView:
    """Running and waiting gauges of one replica, scraped every 10 s: idle before the deploy, then ``candidate``."""
    rows = []
    series = [(0.0, 0.0)] * 30 + candidate
    for i, (running, waiting) in enumerate(series):
        for name, value in (("vllm:num_requests_running", running), ("vllm:num_requests_waiting", waiting)):
            rows.append({"name": name, "kind": "gauge", "time_ns": int(10e9 * i), "value": value,
                         "service_name": "vllm", "service_instance": "r1", "host_name": "r1",
                         "series_key": f"{name}|r1"})  # fmt: skip
    return _view(_points(path, rows))


def test_a_cap_on_running_requests_queues_only_at_the_peak(tmp_path: Path) -> None:
    # max_num_seqs 8 after a hot swap: the old cap's 40 requests drain first, then the replica
    # runs at most 8 and every queue waits at 8.
    drain = [(40.0, 6.0), (25.0, 9.0), (12.0, 7.0)]
    capped = [(8.0, 5.0), (6.0, 0.0), (8.0, 12.0), (7.0, 0.0), (8.0, 3.0), (5.0, 0.0)] * 4 + [(8.0, 2.0)]
    full = _gauges(tmp_path / "cap.duckdb", drain + capped).running_at_queues()
    assert full.baseline is None  # nothing queued before the deploy
    assert full.candidate == pytest.approx(1.0)


def test_one_queued_scrape_at_a_peak_is_no_cap(tmp_path: Path) -> None:
    # Heavier requests, no cap: the running count wanders 3-9 and requests waited at one scrape
    # only, the busiest (at the peak by construction). A cap that binds keeps requests waiting;
    # the same peak with a queue at most scrapes is one.
    wandering = [(5.0, 0.0), (3.0, 0.0), (7.0, 1.0), (4.0, 0.0), (6.0, 0.0)] * 5 + [(9.0, 3.0), (5.0, 0.0)]
    view = _gauges(tmp_path / "once.duckdb", wandering)
    assert view.running_at_queues().candidate == pytest.approx(1.0)
    assert not cap_binds(view)
    capped = [(8.0, 5.0), (6.0, 0.0), (8.0, 12.0), (7.0, 0.0), (8.0, 3.0), (5.0, 0.0)] * 4
    assert cap_binds(_gauges(tmp_path / "cap.duckdb", capped))


def test_requests_admitted_slowly_queue_below_the_peak(tmp_path: Path) -> None:
    # A small step budget: queues of 11-23 at 2-4 running on a replica that runs 6 in between.
    slow = [(2.0, 23.0), (6.0, 0.0), (3.0, 11.0), (5.0, 1.0), (4.0, 15.0), (6.0, 0.0), (2.0, 12.0)] * 3
    full = _gauges(tmp_path / "slow.duckdb", slow).running_at_queues()
    assert full.candidate is not None
    assert full.candidate < 0.6


def _step_store(path: Path, *, load: float, step_factor: float) -> MetricView:
    """Two replicas scraped every 10 s for 600 s (deploy at 300 s): running gauge, prompt-token counter
    and ITL histogram, the mean ITL of each interval following one step model,
    ``0.01 + 0.002 x running + 2e-6 x prompt tokens/s`` (times ``step_factor`` after the deploy), with
    ``load`` times the running batch and prompt tokens after it."""
    rng = random.Random(7)
    rows = []
    for host in ("r1", "r2"):
        tokens = count = 0
        seconds = 0.0
        for k in range(61):
            t = 10.0 * k
            after = t > 300
            running = rng.uniform(2, 12) * (load if after else 1.0)
            prompt_per_s = rng.uniform(500, 3000) * (load if after else 1.0)
            itl = (0.01 + 0.002 * running + 2e-6 * prompt_per_s) * (step_factor if after else 1.0)
            itl *= rng.uniform(0.9, 1.1)
            if k:
                tokens += int(prompt_per_s * 10)
                n = int(running * 10 / itl)
                count += n
                seconds += n * itl
            series = {"service_name": "vllm", "service_instance": host, "host_name": host, "time_ns": int(t * 1e9)}
            rows.append({**series, "name": "vllm:num_requests_running", "kind": "gauge", "value": running,
                         "series_key": f"run|{host}"})  # fmt: skip
            rows.append({**series, "name": "vllm:prompt_tokens", "kind": "counter", "value": float(tokens),
                         "temporality": "cumulative", "start_time_ns": 0, "series_key": f"prompt|{host}"})  # fmt: skip
            rows.append({**series, "name": "vllm:inter_token_latency_seconds", "kind": "histogram",
                         "start_time_ns": 0, "temporality": "cumulative", "count": count, "sum": seconds,
                         "bounds": list(BOUNDS), "bucket_counts": [0, count] + [0] * (len(BOUNDS) - 1),
                         "series_key": f"itl|{host}"})  # fmt: skip
    return _view(_points(path, rows))


def test_a_step_that_only_carries_a_bigger_batch_is_the_same_step(tmp_path: Path) -> None:
    # Load x1.8: the batch and the prompts each step shares grew, the mean ITL with them (x1.4), and
    # the step at the candidate's batch and prefill is the baseline's own.
    view = _step_store(tmp_path / "load.duckdb", load=1.8, step_factor=1.0)
    itl = view.histogram("itl_seconds")
    assert itl["baseline"] is not None
    assert itl["candidate"] is not None
    assert itl["candidate"].mean / itl["baseline"].mean > 1.3
    step = metric_step(view)
    assert step is not None
    assert step.ratio == pytest.approx(1.0, abs=0.08)


def test_a_slower_step_is_slower_at_the_same_batch_and_prefill(tmp_path: Path) -> None:
    step = metric_step(_step_store(tmp_path / "slow.duckdb", load=1.0, step_factor=1.5))
    assert step is not None
    assert step.ratio == pytest.approx(1.5, abs=0.1)
    assert step.z >= 3
    # With the load grown as well, the step still reads its own slowdown.
    both = metric_step(_step_store(tmp_path / "both.duckdb", load=1.8, step_factor=1.5))
    assert both is not None
    assert both.ratio == pytest.approx(1.5, abs=0.12)


def test_the_step_is_compared_only_at_batches_the_baseline_ran(tmp_path: Path) -> None:
    # Load x5: the candidate ran 10-60 requests a replica, the baseline 2-12. Its line is not drawn
    # that far (a step's cost is not linear there), and too few candidate intervals lie within it.
    assert metric_step(_step_store(tmp_path / "far.duckdb", load=5.0, step_factor=1.0)) is None
