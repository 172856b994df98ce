"""Layering: the core never loads textual; `import sre_agent` loads no heavy library."""

from __future__ import annotations

import importlib.util
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


#: Modules of an optional extra (pip install 'sre-agent[clickhouse]'): importable only with it.
OPTIONAL = {"sre_agent.store.clickhouse": "sqlglot", "sre_agent.store.clickhouse_dialect": "sqlglot"}


def test_no_core_module_loads_textual() -> None:
    core = [
        m.name
        for m in pkgutil.walk_packages(sre_agent.__path__, "sre_agent.")
        if not m.name.startswith("sre_agent.tui") and m.name != "sre_agent.__main__"
    ]
    assert len(core) > 5
    installed = {name for name, needs in OPTIONAL.items() if importlib.util.find_spec(needs) is not None}
    loaded = _modules_loaded_after(
        "\n".join(f"import {name}" for name in core if name not in OPTIONAL or name in installed)
    )
    assert "textual" not in loaded


def test_a_clickhouse_store_without_the_extra_is_one_clear_line(tmp_path: Path) -> None:
    """Without sqlglot (the default install), --store clickhouse://... says what to install (exit 2)."""
    code = (
        "import sys; sys.modules['sqlglot'] = None\n"  # as if the extra were not installed
        "from sre_agent.cli import main\n"
        "sys.exit(main(['diagnose', '--store', 'chdb:" + str(tmp_path) + "', '--since-last-deploy']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    assert "pip install 'sre-agent[clickhouse]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_import_linter_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


# What a rule may not do with the comparison: run SQL on its connection or hold one (issue 16:
# rules get data from the comparison, so the same rules can run over another engine).
_ENGINE_ATTRIBUTES = frozenset({"con", "_con", "execute", "sql", "fetchall", "fetchone", "register"})


def _engine_uses(path: Path) -> list[str]:
    import ast

    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _ENGINE_ATTRIBUTES:
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{path.name}:{node.lineno}: import {n}" for n in names if n.split(".")[0] == "duckdb"]
    return found


def test_no_rule_touches_the_engine() -> None:
    rules = sorted((ROOT / "rules").glob("*.py"))
    assert len(rules) > 10
    uses = [use for path in rules for use in _engine_uses(path)]
    assert not uses, "rules must read data from the comparison, not the engine:\n" + "\n".join(uses)


def test_the_engine_check_sees_a_query(tmp_path: Path) -> None:
    # The check above could pass by looking at nothing; it must catch the forms rules used to take.
    bad = tmp_path / "bad_rule.py"
    bad.write_text("import duckdb\n\ndef rule(comparison):\n    return comparison.con.sql('SELECT 1').pl()\n")
    assert len(_engine_uses(bad)) == 3  # the import, .con and .sql


#: Longest module of the analysis layer (issue 16): past it a module holds more than one part.
ANALYSIS_MAX_LINES = 600


def test_no_analysis_module_outgrows_one_part() -> None:
    sizes = {
        p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in (ROOT / "sre_agent" / "analysis").glob("*.py")
    }
    assert sizes, "no analysis modules found"
    over = {name: n for name, n in sizes.items() if n > ANALYSIS_MAX_LINES}
    assert not over, f"analysis modules over {ANALYSIS_MAX_LINES} lines: {over}"
