"""The console in a real terminal: `sre-agent tui` inside tmux, on a replayed incident and on bad stores."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from receiver_harness import ServeProcess

from sre_agent.analysis import explore
from sre_agent.analysis.selection import Selection
from sre_agent.tui.widgets import tile_lines

POLL_TIMEOUT_S = 180.0  # the diagnosis runs in its own process; CI machines are shared


def tmux(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", "-u", *args], capture_output=True, text=True, check=False)


def pane(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session).stdout


def wait_for(session: str, condition: Callable[[str], bool], timeout_s: float = POLL_TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = pane(session)
        if condition(text):
            return text
        time.sleep(0.25)
    raise AssertionError(f"the terminal never showed what was expected; last screen:\n{text}")


def start_session(command: str) -> str:
    """Run ``command`` in a detached 80x24 tmux session; returns the session name."""
    assert shutil.which("tmux"), "tmux is needed for the real-terminal check"
    session = f"sre-agent-tui-test-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "xterm-256color"}
    started = subprocess.run(
        ["tmux", "-u", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    return session


def test_console_in_tmux_shows_top_finding_and_p99_figures(replay_db: Path) -> None:
    con = duckdb.connect(str(replay_db), read_only=True)
    try:
        overview = explore.overview(con, explore.resolve_scope(con, Selection(mode="since_last_deploy")))
    finally:
        con.close()
    p99_lines = [tile_lines(tile)[1] for tile in overview.tiles]

    session = start_session(f"{shlex.quote(sys.executable)} -m sre_agent tui --db {shlex.quote(str(replay_db))}")
    try:
        screen = wait_for(session, lambda text: all(line in text for line in p99_lines))
        assert "What:" in screen
        screen = wait_for(session, lambda text: "Why:   #1 prefix_cache" in text)
        for line in p99_lines:
            assert line in screen
        tmux("send-keys", "-t", session, "f")
        screen = wait_for(session, lambda text: "▼ #1 prefix_cache" in text and "next:" in text, 30)
        tmux("send-keys", "-t", session, "s")
        screen = wait_for(session, lambda text: "dimension" in text and "dependency" in text, 60)
        tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 30
        while tmux("has-session", "-t", session).returncode == 0:
            assert time.monotonic() < deadline, "q did not quit the console"
            time.sleep(0.2)
    finally:
        tmux("kill-session", "-t", session)


def run_in_terminal(args: str, tmp_path: Path, timeout_s: float = 60.0) -> tuple[int, str]:
    """``sre-agent tui ARGS`` with stdin, stdout and stderr on a real terminal: exit code and screen text.

    The screen holds only what the command printed (no shell prompt), its
    wrapped lines joined back (``capture-pane -J``), so it reads as stderr.
    """
    rc_file = tmp_path / "rc"
    command = f"{shlex.quote(sys.executable)} -m sre_agent tui {args}; echo $? > {shlex.quote(str(rc_file))}; sleep 60"
    session = start_session(f"bash -c {shlex.quote(command)}")
    try:
        deadline = time.monotonic() + timeout_s
        while not (rc_file.exists() and rc_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise AssertionError(f"the console did not exit by itself; screen:\n{pane(session)}")
            time.sleep(0.2)
        screen = tmux("capture-pane", "-p", "-J", "-t", session).stdout
        return int(rc_file.read_text()), screen
    finally:
        tmux("kill-session", "-t", session)


def assert_one_readable_line(stderr: str, *expected: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    for text in expected:
        assert text in lines[0], stderr


def test_missing_store_is_one_line_and_exit_1_in_a_terminal(tmp_path: Path) -> None:
    missing = tmp_path / "missing.duckdb"
    rc, screen = run_in_terminal(f"--db {shlex.quote(str(missing))}", tmp_path)
    assert rc == 1
    assert_one_readable_line(screen, "no store at", str(missing))
    assert not missing.exists()  # a read-only check creates nothing


def test_store_locked_by_serve_is_one_line_and_exit_1(served_synth: ServeProcess, tmp_path: Path) -> None:
    rc, screen = run_in_terminal(f"--db {shlex.quote(str(served_synth.db))}", tmp_path)
    assert rc == 1
    assert_one_readable_line(screen, "locked", "--url")


@pytest.mark.parametrize("content", [b"not a database\n", None], ids=["text-file", "foreign-duckdb"])
def test_a_file_that_is_not_a_store_is_one_line_and_exit_1(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "other.duckdb"
    if content is None:
        con = duckdb.connect(str(path))
        con.execute("CREATE TABLE unrelated (a INTEGER)")
        con.close()
    else:
        path.write_bytes(content)
    rc, screen = run_in_terminal(f"--db {shlex.quote(str(path))}", tmp_path)
    assert rc == 1
    assert_one_readable_line(screen, str(path))


def test_unreachable_server_at_start_is_one_line_and_exit_1(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        rc, screen = run_in_terminal(f"--url http://127.0.0.1:{port}", tmp_path)
    assert rc == 1
    assert_one_readable_line(screen, "cannot reach", str(port))
