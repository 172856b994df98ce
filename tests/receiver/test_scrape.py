"""The scraper against real HTTP targets on loopback (issue 15, item 1).

Equivalence with the OTLP path: the same numbers are exposed by
``prometheus_client`` (the library vLLM and SGLang expose their metrics with)
and written, independently, as the OTLP JSON a Collector would send; one goes
through the scraper, the other through ``decode_metrics`` (what
``POST /v1/metrics`` runs), each into its own store, and every stored column
must agree. Recorded vLLM text (and SGLang-shaped text) is checked against
values read from the files; a target that goes down and comes back, and
garbage, are scraped for real.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.selection import Selection
from sre_agent.analysis.selection import Window as SelectionWindow
from sre_agent.config import ScrapeTarget
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_metrics
from sre_agent.ingest.receiver import Writer
from sre_agent.ingest.scrape import Scraper
from sre_agent.store.embedded import Store

DATA = Path(__file__).parent / "scrape_data"
T0_NS = 1_790_000_000_000_000_000
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
TTFT_BUCKETS += (80.0, 160.0, 640.0, 2560.0)


class Target(ThreadingHTTPServer):
    """A real HTTP server on loopback answering GET with ``body`` and ``status``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int = 0) -> None:
        self.body: bytes = b""
        self.status = 200
        self.content_type = "text/plain; version=0.0.4; charset=utf-8"
        self.hits = 0
        super().__init__(("127.0.0.1", port), _Handler)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    server: Target

    def do_GET(self) -> None:
        self.server.hits += 1
        self.send_response(self.server.status)
        self.send_header("Content-Type", self.server.content_type)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass


@pytest.fixture
def target() -> Iterator[Target]:
    server = Target()
    try:
        yield server
    finally:
        server.stop()


class Stored:
    """A store with a running writer: what ``serve`` puts behind both the scraper and /v1/metrics."""

    def __init__(self) -> None:
        self.store = Store.open(":memory:")
        self.writer = Writer(self.store, queue_max_rows=100_000, batch_max_rows=10_000, flush_interval_s=0.0)
        self.writer.start()
        self.normaliser = Normaliser(hash_key=b"scrape-test")

    def scraper(self, *targets: ScrapeTarget, clock: list[int]) -> Scraper:
        return Scraper(
            targets,
            interval_s=1.0,
            submit=lambda table: self.writer.submit("metric_points", table),
            normaliser=self.normaliser,
            clock_ns=lambda: clock[0],
        )

    def ingest_otlp_json(self, request: dict[str, Any]) -> None:
        decoded = decode_metrics(json.dumps(request).encode(), "application/json", normaliser=self.normaliser)
        assert decoded.rejected == 0, decoded.errors
        self.writer.submit("metric_points", decoded.table).result(10)

    def rows(self, where: str = "true") -> list[dict[str, Any]]:
        cursor = self.store.cursor()
        result = cursor.execute(f"SELECT * FROM metric_points WHERE {where} ORDER BY series_key, time_ns")
        names = [d[0] for d in result.description]
        return [
            {k: (sorted(v.items()) if isinstance(v, dict) else v) for k, v in zip(names, row, strict=True)}
            for row in result.fetchall()
        ]

    def close(self) -> None:
        self.writer.close()
        self.store.close()


@pytest.fixture
def stored() -> Iterator[Stored]:
    s = Stored()
    try:
        yield s
    finally:
        s.close()


# -- the same data, as prometheus_client exposes it and as a Collector sends it ------------------


def _kv(mapping: dict[str, str]) -> list[dict[str, Any]]:
    return [{"key": k, "value": {"stringValue": v}} for k, v in sorted(mapping.items())]


def _created(registry: CollectorRegistry) -> dict[str, float]:
    """metric family name -> its ``_created`` time (seconds), as the registry reports it."""
    out = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_created"):
                out[family.name] = sample.value
    return out


def _engine_data(
    engine: str, hits: float, running: float, ttfts: list[float]
) -> tuple[CollectorRegistry, dict[str, Any]]:
    """A registry holding the numbers, and the numbers themselves."""
    registry = CollectorRegistry()
    labels = {"model_name": "tiny"} if engine == "sglang" else {"engine": "0", "model_name": "tiny"}
    names = {
        "vllm": ("vllm:prefix_cache_hits", "vllm:num_requests_running", "vllm:time_to_first_token_seconds"),
        "sglang": ("sglang:cached_tokens", "sglang:num_running_reqs", "sglang:time_to_first_token_seconds"),
    }[engine]
    counter = Counter(names[0], "prefix-cache hits in tokens", list(labels), registry=registry)
    counter.labels(**labels).inc(hits)
    gauge = Gauge(names[1], "requests running", list(labels), registry=registry)
    gauge.labels(**labels).set(running)
    histogram = Histogram(names[2], "TTFT", list(labels), buckets=TTFT_BUCKETS, registry=registry)
    for value in ttfts:
        histogram.labels(**labels).observe(value)
    return registry, {"names": names, "labels": labels, "hits": hits, "running": running, "ttfts": ttfts}


def _exposition(registry: CollectorRegistry, *, created: bool) -> bytes:
    text = generate_latest(registry).decode()
    if not created:  # SGLang runs prometheus_client in multiprocess mode, which exposes no _created series
        text = "".join(line + "\n" for line in text.splitlines() if "_created" not in line)
    return text.encode()


def _collector_request(
    data: dict[str, Any], resource: dict[str, str], time_ns: int, starts: dict[str, int]
) -> dict[str, Any]:
    """The OTLP JSON a Collector's prometheus receiver sends for ``data`` (written from the numbers)."""
    counter, gauge, histogram = data["names"]
    attrs = _kv(data["labels"])
    per_bucket = [0] * (len(TTFT_BUCKETS) + 1)
    for value in data["ttfts"]:
        index = next((i for i, bound in enumerate(TTFT_BUCKETS) if value <= bound), len(TTFT_BUCKETS))
        per_bucket[index] += 1
    metrics = [
        {
            "name": counter + "_total",
            "sum": {
                "aggregationTemporality": 2,
                "isMonotonic": True,
                "dataPoints": [
                    {
                        "attributes": attrs,
                        "startTimeUnixNano": str(starts[counter]),
                        "timeUnixNano": str(time_ns),
                        "asDouble": data["hits"],
                    }
                ],
            },
        },
        {
            "name": gauge,
            "gauge": {"dataPoints": [{"attributes": attrs, "timeUnixNano": str(time_ns), "asDouble": data["running"]}]},
        },
        {
            "name": histogram,
            "histogram": {
                "aggregationTemporality": 2,
                "dataPoints": [
                    {
                        "attributes": attrs,
                        "startTimeUnixNano": str(starts[histogram]),
                        "timeUnixNano": str(time_ns),
                        "count": str(len(data["ttfts"])),
                        "sum": sum(data["ttfts"]),
                        "explicitBounds": list(TTFT_BUCKETS),
                        "bucketCounts": [str(c) for c in per_bucket],
                    }
                ],
            },
        },
    ]
    return {"resourceMetrics": [{"resource": {"attributes": _kv(resource)}, "scopeMetrics": [{"metrics": metrics}]}]}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_scraped_points_equal_what_the_otlp_path_stores_for_the_same_data(target: Target, engine: str) -> None:
    registry, data = _engine_data(engine, hits=4096.0, running=5.0, ttfts=[0.004, 0.03, 0.03, 0.2, 1.7, 3000.0])
    target.body = _exposition(registry, created=engine == "vllm")
    resource = {"service.name": engine, "service.instance.id": "engine-0", "host.name": "node-7"}
    scrape_target = ScrapeTarget(target.url, instance="engine-0", host="node-7")  # service.name from the prefix
    created = _created(registry)
    # Without _created series a Collector starts a series at its first scrape.
    starts = {name: round(created[name] * 1e9) if engine == "vllm" else T0_NS for name in created}

    scraped, collected = Stored(), Stored()
    try:
        assert scraped.scraper(scrape_target, clock=[T0_NS]).scrape(scrape_target) == 3
        collected.ingest_otlp_json(_collector_request(data, resource, T0_NS, starts))
        rows = scraped.rows()
        assert rows == collected.rows()
    finally:
        scraped.close()
        collected.close()
    by_name = {row["name"]: row for row in rows}
    assert set(by_name) == {data["names"][0], data["names"][1], data["names"][2]}
    histogram = by_name[data["names"][2]]
    assert histogram["bounds"] == list(TTFT_BUCKETS)
    assert histogram["bucket_counts"][-1] == 1  # 3000 s is above every bound: the +Inf bucket
    assert (histogram["service_name"], histogram["service_instance"], histogram["host_name"]) == (
        engine,
        "engine-0",
        "node-7",
    )


def test_counter_and_histogram_resets_are_deltas_in_the_window(target: Target, stored: Stored) -> None:
    """An engine restart between scrapes: the totals drop; the window's increase counts the new run."""
    clock = [T0_NS]
    scrape_target = ScrapeTarget(target.url)
    scraper = stored.scraper(scrape_target, clock=clock)
    steps = [(1000.0, [0.01] * 10), (1600.0, [0.01] * 10 + [0.3] * 4), (50.0, [2.0] * 3)]  # restart before the third
    for i, (hits, ttfts) in enumerate(steps):
        registry, _ = _engine_data("vllm", hits=hits, running=1.0, ttfts=ttfts)
        target.body = _exposition(registry, created=False)  # no _created: start times come from the scraper
        clock[0] = T0_NS + i * 5_000_000_000
        assert scraper.scrape(scrape_target) == 3

    starts = [r["start_time_ns"] for r in stored.rows("name = 'vllm:prefix_cache_hits'")]
    assert starts == [T0_NS, T0_NS, T0_NS + 10_000_000_000]  # the reset starts the series again

    class Window:
        def __init__(self, start_ns: int, end_ns: int) -> None:
            self.start_ns, self.end_ns, self.version = start_ns, end_ns, None

        @property
        def seconds(self) -> float:
            return (self.end_ns - self.start_ns) / 1e9

    whole = Window(T0_NS, T0_NS + 11_000_000_000)
    interval = SelectionWindow(whole.start_ns, whole.end_ns)
    view = MetricView(stored.store.cursor(), whole, whole, Selection("windows", baseline=interval, candidate=interval))
    assert view.counter_delta("prefix_cache_hits").baseline == 600.0 + 50.0
    ttft = view.histogram("ttft_seconds")["baseline"]
    assert ttft is not None
    assert ttft.count == 4 + 3


def test_recorded_vllm_text_is_stored_with_its_values(target: Target, stored: Stored) -> None:
    text = (DATA / "vllm-0.32.0-cpu.prom").read_text()
    target.body = text.encode()
    scrape_target = ScrapeTarget(target.url, instance="vllm-0")
    scraper = stored.scraper(scrape_target, clock=[T0_NS])
    points = scraper.scrape(scrape_target)
    assert 'sre_agent_scrape_points_rejected_total{target="' + target.url + '"} 0' in scraper.render_prometheus()

    # Every sample line is one point, except that a histogram or summary series is one point (its _count
    # line stands for it) and _created lines are start times.
    grouped = set(re.findall(r"^# TYPE (\S+) (?:histogram|summary)$", text, re.M))
    names = [line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")]
    expected = sum(
        1
        for name in names
        if not name.endswith("_created") and (name.rsplit("_", 1)[0] not in grouped or name.endswith("_count"))
    )
    assert points == expected
    assert not stored.rows("name LIKE '%_created'")

    queries = stored.rows("name = 'vllm:prefix_cache_queries'")
    assert [(r["source_name"], r["kind"], r["temporality"], r["is_monotonic"], r["value"]) for r in queries] == [
        ("vllm:prefix_cache_queries_total", "sum", "cumulative", True, 168.0)
    ]
    created = re.search(r'^vllm:prefix_cache_queries_created\{engine="0",model_name="tiny"\} (\S+)$', text, re.M)
    assert created is not None
    assert queries[0]["start_time_ns"] == round(float(created.group(1)) * 1e9)
    assert queries[0]["model"] == "tiny"
    assert (queries[0]["service_name"], queries[0]["service_instance"], queries[0]["host_name"]) == (
        "vllm",
        "vllm-0",
        "127.0.0.1",
    )
    finished = {
        dict(r["attributes"])["finished_reason"]: r["value"] for r in stored.rows("name = 'vllm:request_success'")
    }
    assert finished == {"stop": 0.0, "length": 12.0, "abort": 0.0, "error": 0.0, "repetition": 0.0}
    [ttft] = stored.rows("name = 'vllm:time_to_first_token_seconds'")
    assert ttft["bounds"] == list(TTFT_BUCKETS)
    assert (ttft["count"], sum(ttft["bucket_counts"]), ttft["sum"]) == (12, 12, 3.1046109199523926)
    [iteration] = stored.rows("name = 'vllm:iteration_tokens'")  # a histogram whose name ends in _total
    assert iteration["kind"] == "histogram"


def test_sglang_text_is_stored_under_the_signals_the_rules_read(target: Target, stored: Stored) -> None:
    target.body = (DATA / "sglang-0.5.prom").read_bytes()
    scrape_target = ScrapeTarget(target.url)
    assert stored.scraper(scrape_target, clock=[T0_NS]).scrape(scrape_target) == 12
    assert {r["name"] for r in stored.rows()} >= {
        "sglang:cached_tokens",
        "sglang:token_usage",
        "sglang:num_retracted_requests",
        "sglang:time_to_first_token_seconds",
    }
    [ttft] = stored.rows("name = 'sglang:time_to_first_token_seconds'")
    assert ttft["bounds"] == [0.1, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert ttft["bucket_counts"] == [40, 110, 40, 8, 2, 0, 0]
    assert (ttft["start_time_ns"], ttft["service_name"]) == (T0_NS, "sglang")
    [cached] = stored.rows("name = 'sglang:cached_tokens'")
    assert (cached["kind"], cached["value"], dict(cached["attributes"])["cache_source"]) == ("sum", 44544.0, "device")


GARBAGE = {
    "html": (200, b"<html><body>502 Bad Gateway</body></html>"),
    "json": (200, b'{"num_requests_running": 3}'),
    "bytes": (200, bytes(range(256)) * 4),
    "truncated": (200, b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="ti'),
    "status": (503, b"vllm:num_requests_running 1\n"),
}


def test_garbage_and_error_status_store_nothing_and_are_counted(target: Target, stored: Stored) -> None:
    scrape_target = ScrapeTarget(target.url)
    scraper = stored.scraper(scrape_target, clock=[T0_NS])
    for status, body in GARBAGE.values():
        target.status, target.body = status, body
        assert scraper.scrape(scrape_target) == 0
    assert stored.rows() == []
    text = scraper.render_prometheus()
    url = target.url
    assert f'sre_agent_scrape_failures_total{{target="{url}",reason="not_prometheus_text"}} 4' in text
    assert f'sre_agent_scrape_failures_total{{target="{url}",reason="http_status"}} 1' in text
    assert f'sre_agent_scrape_up{{target="{url}"}} 0' in text
    target.status, target.body = 200, b"vllm:num_requests_running 2\n"  # untyped: stored as a gauge
    assert scraper.scrape(scrape_target) == 1
    assert [(r["name"], r["kind"], r["value"]) for r in stored.rows()] == [("vllm:num_requests_running", "gauge", 2.0)]
    assert f'sre_agent_scrape_up{{target="{url}"}} 1' in scraper.render_prometheus()


def test_a_target_that_goes_down_and_comes_back_is_stored_again(stored: Stored) -> None:
    first = Target()
    port = first.server_address[1]
    registry, _ = _engine_data("vllm", hits=10.0, running=1.0, ttfts=[0.1])
    first.body = _exposition(registry, created=True)
    scrape_target = ScrapeTarget(first.url)
    clock = [T0_NS]
    scraper = stored.scraper(scrape_target, clock=clock)
    assert scraper.scrape(scrape_target) == 3
    first.stop()  # nothing listens on the port now
    clock[0] += 5_000_000_000
    assert scraper.scrape(scrape_target) == 0
    assert scraper.scrape(scrape_target) == 0
    assert 'reason="unreachable"} 2' in scraper.render_prometheus()
    back = Target(port)
    try:
        back.body = first.body
        clock[0] += 5_000_000_000
        assert scraper.scrape(scrape_target) == 3
    finally:
        back.stop()
    assert [r["time_ns"] for r in stored.rows("name = 'vllm:num_requests_running'")] == [T0_NS, T0_NS + 10_000_000_000]
    assert f'sre_agent_scrape_points_total{{target="{first.url}"}} 6' in scraper.render_prometheus()
