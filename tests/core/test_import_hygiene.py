"""Layering: the core never loads textual; `import sre_agent` loads no heavy library."""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import sre_agent

ROOT = Path(__file__).resolve().parents[2]


def _modules_loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {line.split(".")[0] for line in out.splitlines()}


def test_import_sre_agent_is_light() -> None:
    loaded = _modules_loaded_after("import sre_agent")
    assert not loaded & {"textual", "duckdb", "polars", "pyarrow", "grpc", "starlette"}


def test_no_core_module_loads_textual() -> None:
    core = [
        m.name
        for m in pkgutil.walk_packages(sre_agent.__path__, "sre_agent.")
        if not m.name.startswith("sre_agent.tui") and m.name != "sre_agent.__main__"
    ]
    assert len(core) > 5
    loaded = _modules_loaded_after("\n".join(f"import {name}" for name in core))
    assert "textual" not in loaded


def test_import_linter_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
