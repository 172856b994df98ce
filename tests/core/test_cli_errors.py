"""Wrong invocations a new user makes (issue 14): one readable line on stderr and a documented exit code.

Each test drives the real CLI entry point against real DuckDB files, real files
on disk and real loopback sockets (a closed port, or a small HTTP server).
"""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from sre_agent.cli import main
from sre_agent.errors import StoreError
from sre_agent.store.embedded import Store

MS_DEPLOY = "1768468200000"  # 2026-01-15T09:10:00Z in Unix milliseconds


def closed_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Exit code and stderr of one in-process CLI run."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.fixture
def empty_store(tmp_path: Path) -> Path:
    path = tmp_path / "store.duckdb"
    Store.open(path).close()
    return path


@pytest.fixture
def foreign_db(tmp_path: Path) -> Path:
    """A DuckDB file of someone else's: one unrelated table."""
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE orders (id INTEGER)")
    con.close()
    return path


# ------------------------------------------------------------------ times


@pytest.mark.parametrize("command", ["diagnose", "canary"])
def test_deploy_at_in_milliseconds_is_a_usage_error_naming_the_unit(
    command: str, empty_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slo = ["--slo", "ttft_p99=2s"] if command == "canary" else []
    for store in (["--db", str(empty_store)], ["--url", f"http://127.0.0.1:{closed_port()}"]):
        code, err = run_cli(capsys, command, *store, "--deploy-at", MS_DEPLOY, *slo)
        assert code == 2
        assert "milliseconds" in err
        assert "1768468200" in err  # the seconds it probably meant
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["1e400", "-5", "99999999999999999999999", "0001-01-01T00:00:00Z"])
def test_out_of_range_times_are_usage_errors(text: str, empty_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(capsys, "diagnose", "--db", str(empty_store), "--deploy-at", text)
    assert code == 2
    assert err.startswith("error: ")


def test_a_window_longer_than_ten_years_is_a_usage_error(empty_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(
        capsys, "diagnose", "--db", str(empty_store), "--deploy-at", "1768468200", "--window", "99999999d"
    )
    assert (code, "ten years" in err) == (2, True)


# ------------------------------------------------------------------ option combinations


@pytest.mark.parametrize(
    "argv",
    [
        ["diagnose"],
        ["canary", "--slo", "ttft_p99=2s"],
        ["ingest", "nothing.jsonl"],
        ["tui"],
    ],
)
def test_db_and_url_together_are_a_usage_error(
    argv: list[str], empty_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    code, err = run_cli(capsys, argv[0], "--db", str(empty_store), "--url", url, *argv[1:])
    assert code == 2
    assert "--db" in err
    assert "--url" in err
    assert "not both" in err


def test_a_db_flag_outranks_a_url_from_the_environment(
    empty_store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: SRE_AGENT_URL won and --db was silently ignored (a connection error to the URL).
    monkeypatch.setenv("SRE_AGENT_URL", f"http://127.0.0.1:{closed_port()}")
    code, err = run_cli(capsys, "diagnose", "--db", str(empty_store))
    assert code == 2  # the empty local store: a selection without data, not an unreachable server
    assert "cannot reach" not in err


@pytest.mark.parametrize(
    "selection",
    [
        ["--baseline-version", "v1", "--candidate-version", "v2"],
        ["--baseline", "1768460000..1768468000", "--candidate", "1768468000..1768470000"],
    ],
)
def test_window_without_a_deploy_is_a_usage_error(
    selection: list[str], empty_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_cli(capsys, "diagnose", "--db", str(empty_store), *selection, "--window", "15m")
    assert code == 2
    assert "--window" in err
    assert "--deploy-at" in err


def test_window_with_since_last_deploy_still_sizes_the_windows(
    empty_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not a usage error: the window is applied around the last deploy (the empty store then has none).
    code, err = run_cli(capsys, "diagnose", "--db", str(empty_store), "--since-last-deploy", "--window", "15m")
    assert code == 2
    assert "--window" not in err


# ------------------------------------------------------------------ stores


def test_a_duckdb_file_that_is_not_a_store_is_named_as_such(
    foreign_db: Path, empty_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_cli(capsys, "diagnose", "--db", str(foreign_db))
    assert code == 1
    assert f"not an sre-agent store: {foreign_db}" in err
    assert "no spans table" in err
    assert "orders" in err
    assert len(err.strip().splitlines()) == 1
    code, err = run_cli(capsys, "canary", "--db", str(foreign_db), "--slo", "ttft_p99=2s")
    assert code in (1, 4)  # 4 "could not evaluate" once the canary maps store errors (CONTRACTS section 2)
    assert "not an sre-agent store" in err
    assert "Catalog Error" not in err
    assert len(err.strip().splitlines()) == 1


def test_an_empty_duckdb_file_is_not_a_store_to_read_but_becomes_one_when_written(tmp_path: Path) -> None:
    path = tmp_path / "empty.duckdb"
    duckdb.connect(str(path)).close()
    with pytest.raises(StoreError, match=r"not an sre-agent store.*the database is empty"):
        Store.open(path, read_only=True)
    with Store.open(path) as store:
        assert store.counts() == {"spans": 0, "metric_points": 0, "deploys": 0}


def test_a_writable_open_leaves_someone_elses_database_alone(foreign_db: Path) -> None:
    with pytest.raises(StoreError, match="not an sre-agent store"):
        Store.open(foreign_db)
    con = duckdb.connect(str(foreign_db), read_only=True)  # the failed open released the file
    tables = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    con.close()
    assert tables == {"orders"}


# ------------------------------------------------------------------ ingest


def test_ingest_of_files_that_are_not_telemetry_says_so_per_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is a text file\nwith two lines\n")
    noise = tmp_path / "noise.bin"
    noise.write_bytes(os.urandom(3000))
    fake_gz = tmp_path / "fake.jsonl.gz"
    fake_gz.write_text("not gzip at all")
    brace = tmp_path / "config.json"
    brace.write_text("{ this: is not json }\n")
    files = [text, noise, fake_gz, brace]
    code, err = run_cli(capsys, "ingest", "--db", str(tmp_path / "s.duckdb"), *map(str, files))
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == len(files)
    for path, line in zip(files, lines, strict=True):
        assert line.startswith(f"{path}: not ingested: not a telemetry file (expected OTLP JSON lines")
    assert "exceeds the cap" not in err


# ------------------------------------------------------------------ replay


def test_replay_to_a_closed_port_fails_fast_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for scheme in ("http", "grpc"):
        started = time.monotonic()
        code, err = run_cli(
            capsys, "replay", "none_version_bump", "--endpoint", f"{scheme}://127.0.0.1:{closed_port()}"
        )
        assert time.monotonic() - started < 10.0
        assert code == 1
        assert err.startswith("error: cannot reach the OTLP endpoint")
        assert len(err.strip().splitlines()) == 1


class _Rejecting(http.server.BaseHTTPRequestHandler):
    """An OTLP endpoint that is up but refuses every export with 400 (not retryable)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the CLI's stderr, not the server's."""


@pytest.fixture
def rejecting_endpoint() -> Iterator[tuple[str, list[int]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Rejecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", []
    finally:
        server.shutdown()
        server.server_close()


def test_replay_stops_at_the_first_failed_export(
    rejecting_endpoint: tuple[str, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = rejecting_endpoint
    started = time.monotonic()
    code = main(["replay", "none_version_bump", "--scale", "0.2", "--endpoint", url])
    err = capsys.readouterr().err
    assert time.monotonic() - started < 20.0
    assert code == 1
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: export of")
    assert "replay stopped" in err


def test_replay_of_an_unknown_scenario_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run_cli(capsys, "replay", "no_such_scenario")
    assert code == 1
    assert "no such scenario" in err
    code, err = run_cli(capsys, "replay", str(tmp_path))  # a directory, not a file
    assert code == 1
    assert "cannot read the scenario" in err
    code, err = run_cli(capsys, "replay", "none_version_bump", "--out", str(tmp_path / "missing" / "x.jsonl"))
    assert code == 1
    assert "cannot write" in err
