"""`sre-agent serve --scrape` as a real process, and serve's start-up on busy ports.

The scrape target is a real HTTP server on loopback serving recorded vLLM
text; it goes down, serves garbage and comes back while ``serve`` keeps
running, and ``/metrics`` counts what happened.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from receiver_harness import free_port, start_serve
from test_scrape import DATA, Target
from test_serve_cli import _run_cli

from sre_agent.store.embedded import Store

INTERVAL = "0.2"


def _wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def _counter(text: str, line_start: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
    assert len(values) == 1, (line_start, text)
    return values[0]


def test_serve_scrapes_through_outage_and_garbage_and_counts_failures(tmp_path: Path) -> None:
    target = Target()
    port = target.server_address[1]
    target.body = (DATA / "vllm-0.32.0-cpu.prom").read_bytes()
    url = target.url
    db = tmp_path / "scraped.duckdb"
    server = start_serve(db, "--scrape", url, "--scrape-interval", INTERVAL, grpc=False)
    back: Target | None = None
    try:
        assert f"scraping {url} every 0.2 s (service.instance.id=127.0.0.1:{port})" in server.stderr

        def metrics() -> str:
            return httpx.get(f"{server.http_url}/metrics", timeout=10).text

        def failures(reason: str) -> float:
            return _counter(metrics(), f'sre_agent_scrape_failures_total{{target="{url}",reason="{reason}"}}')

        _wait_for(lambda: _counter(metrics(), f'sre_agent_scrape_points_total{{target="{url}"}}') >= 2 * 74)
        assert _counter(metrics(), f'sre_agent_scrape_up{{target="{url}"}}') == 1

        target.body = b"<html>maintenance</html>"
        _wait_for(lambda: failures("not_prometheus_text") >= 2)
        target.stop()  # down: nothing listens on the port
        _wait_for(lambda: failures("unreachable") >= 2)
        assert _counter(metrics(), f'sre_agent_scrape_up{{target="{url}"}}') == 0
        assert httpx.get(f"{server.http_url}/healthz", timeout=10).status_code == 200

        back = Target(port)
        back.body = (DATA / "vllm-0.32.0-cpu.prom").read_bytes()
        _wait_for(lambda: back is not None and back.hits >= 2)
        _wait_for(lambda: _counter(metrics(), f'sre_agent_scrape_up{{target="{url}"}}') == 1)
        points_back = _counter(metrics(), f'sre_agent_scrape_points_total{{target="{url}"}}')
    finally:
        code = server.stop()
        if back is not None:
            back.stop()
        else:
            target.stop()
    assert code == 0
    assert "Traceback" not in server.stderr
    # Logged once per change of state, not once per interval.
    assert server.stderr.count("failed (unreachable)") == 1
    assert server.stderr.count("failed (not_prometheus_text)") == 1
    assert server.stderr.count("is back") == 1
    with Store.open(db, read_only=True) as store:
        stored = store.connection.execute(
            "SELECT count(*), count(DISTINCT time_ns), any_value(service_instance) FROM metric_points"
        ).fetchall()[0]
        before, after = store.connection.execute(
            "SELECT min(time_ns), max(time_ns) FROM metric_points WHERE name = 'vllm:num_requests_running'"
        ).fetchall()[0]
    assert stored[0] >= points_back
    assert stored[0] == 74 * stored[1]  # every successful scrape stored the whole text
    assert stored[2] == f"127.0.0.1:{port}"
    assert after > before


def test_scrape_table_in_the_config_file(tmp_path: Path) -> None:
    target = Target()
    target.body = (DATA / "sglang-0.5.prom").read_bytes()
    config = tmp_path / "sre-agent.toml"
    config.write_text(
        f'scrape_interval_s = {INTERVAL}\n[[scrape]]\nurl = "{target.url}"\ninstance = "sglang-0"\n'
        'host = "gpu-node-3"\nversion = "v7"\n'
    )
    db = tmp_path / "config.duckdb"
    server = start_serve(db, grpc=False, env={"SRE_AGENT_CONFIG": str(config)})
    try:
        _wait_for(lambda: target.hits >= 2)
    finally:
        code = server.stop()
        target.stop()
    assert code == 0
    with Store.open(db, read_only=True) as store:
        rows = store.connection.execute(
            "SELECT DISTINCT service_name, service_version, service_instance, host_name FROM metric_points"
        ).fetchall()
    assert rows == [("sglang", "v7", "sglang-0", "gpu-node-3")]


def test_busy_ports_exit_1_with_one_line_and_create_no_store(tmp_path: Path) -> None:
    """Issue 14: a busy port left a new empty .duckdb, and a busy gRPC port printed a raw C++ log line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for flags, message in (
            (("--http-port", port, "--grpc-port", str(free_port())), f"cannot listen on 127.0.0.1:{port}"),
            (("--http-port", "0", "--grpc-port", port), f"cannot listen for gRPC on 127.0.0.1:{port}"),
        ):
            db = tmp_path / f"never-{port}-{flags[1]}.duckdb"
            result = _run_cli("serve", "--db", str(db), *flags, cwd=tmp_path)
            assert result.returncode == 1
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert len(lines) == 1, result.stderr
            assert message in lines[0]
            assert not db.exists()
            assert not list(tmp_path.glob("*.duckdb*"))


def test_bad_scrape_flags_are_usage_errors(tmp_path: Path) -> None:
    for flags in (("--scrape", "ftp://x/metrics"), ("--scrape", "http:///metrics"), ("--scrape-interval", "-1")):
        result = _run_cli(
            "serve", "--db", str(tmp_path / "x.duckdb"), "--http-port", "0", "--grpc-port", "0", *flags, cwd=tmp_path
        )
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "x.duckdb").exists()
