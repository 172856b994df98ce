"""A real ``sre-agent serve`` child process for the canary HTTP tests.

Kept out of conftest.py so test modules can import it by a unique name (several conftest
modules share the name ``conftest`` when pytest is given more than one test folder).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

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
