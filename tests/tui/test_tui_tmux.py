"""The console in a real terminal: `sre-agent tui --db` inside tmux on a replayed incident."""

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

from sre_agent import explore
from sre_agent.selection import Selection
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


def test_console_in_tmux_shows_top_finding_and_p99_figures(replay_db: Path) -> None:
    assert shutil.which("tmux"), "tmux is needed for the real-terminal check"
    con = duckdb.connect(str(replay_db), read_only=True)
    try:
        overview = explore.overview(con, explore.resolve_scope(con, Selection(mode="since_last_deploy")))
    finally:
        con.close()
    p99_lines = [tile_lines(tile)[1] for tile in overview.tiles]

    session = f"sre-agent-tui-test-{os.getpid()}"
    command = f"{shlex.quote(sys.executable)} -m sre_agent tui --db {shlex.quote(str(replay_db))}"
    env = {**os.environ, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "xterm-256color"}
    started = subprocess.run(
        ["tmux", "-u", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert started.returncode == 0, started.stderr
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
