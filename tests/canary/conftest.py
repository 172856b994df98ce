"""Fixtures for the canary tests: a real ``sre-agent serve`` on loopback over a prepared store."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from canary_synth import Profile, version_pair_store

READY_TIMEOUT_S = 30.0


class Server:
    """A running ``sre-agent serve`` child with its base URL; stderr is kept for failure messages."""

    def __init__(self, db: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sre_agent",
                "serve",
                "--db",
                str(db),
                "--http-port",
                "0",
                "--grpc-port",
                "0",
                *extra,
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.stderr: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()
        self.url = ""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise AssertionError(f"serve not ready: {''.join(self.stderr)}") from None
            if line is None:
                raise AssertionError(f"serve exited early: {''.join(self.stderr)}")
            if "API on " in line:
                self.url = line.rsplit(" ", 1)[1].strip()
            if "ready" in line:
                break

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self._pump.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


@pytest.fixture(scope="session")
def regression_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v1 baseline and v2 candidate whose TTFT doubled (4000 requests each); read-only in every test."""
    path = tmp_path_factory.mktemp("canary") / "regression.duckdb"
    version_pair_store(path, n_baseline=4000, n_candidate=4000, candidate=Profile(ttft_scale=2.0), seed=5)
    return path


@pytest.fixture(scope="module")
def server(regression_store: Path) -> Iterator[Server]:
    """One real server for the module (starting one per test would dominate the run time)."""
    srv = Server(regression_store)
    try:
        yield srv
    finally:
        assert srv.stop() == 0, "".join(srv.stderr)
