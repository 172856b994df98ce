"""The README's command table is what the CLI is and does.

Parses the table under "## Commands" and checks, for each row: the command
exists (and no command is missing from the table), ``--help`` works and ends
with an example, every exit code the command's own help declares is
documented, and each documented exit code is produced by a real invocation
against real files (a small replayed store, a foreign DuckDB file, text files).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import duckdb
import pytest

from sre_agent.cli import COMMANDS, main

README = Path(__file__).resolve().parents[2] / "README.md"

# Documented codes with no probe here, and why.
UNPROBED = {
    ("serve", 0): "clean shutdown on SIGTERM: tests/receiver/test_serve_cli.py runs a real server",
    ("tui", 0): "quitting the console: the tui tests drive it in a pilot and a real terminal",
    ("tui", 1): "a store error in the console: the tui tests own that path",
}


def readme_commands() -> dict[str, frozenset[int]]:
    """command -> documented exit codes, from the README's "## Commands" table."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    table: dict[str, frozenset[int]] = {}
    for line in section.splitlines():
        if not line.startswith("| `sre-agent "):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 3, line
        name = cells[0].strip("`").split()[1]
        # Codes open the comma-separated items: "0 pass, 1 fail, 3 inconclusive, ...".
        codes = {int(code) for code in re.findall(r"(?:^|,\s*)(\d)\b", cells[2])}
        assert codes, line
        table[name] = frozenset(codes)
    return table


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help exits through argparse
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def declared_codes(command: str) -> frozenset[int]:
    """Exit codes the command's ``--help`` lists after "exit codes:" (empty when it lists none)."""
    code, out, _ = _run([command, "--help"])
    assert code == 0
    match = re.search(r"exit codes:(.*?)(?:\n\s*\n|\Z)", out, re.S)
    if match is None:
        return frozenset()
    return frozenset(int(c) for c in re.findall(r"(?:^|,)\s*(\d)\b", match.group(1).replace("\n", " ")))


def test_the_table_lists_exactly_the_cli_commands() -> None:
    assert set(readme_commands()) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(readme_commands()))
def test_help_works_and_every_declared_exit_code_is_documented(command: str) -> None:
    code, out, err = _run([command, "--help"])
    assert (code, err) == (0, "")
    assert "sre-agent " + command in out.split("xample")[-1]  # ends with an example
    assert declared_codes(command) <= readme_commands()[command]
    assert 2 in readme_commands()[command]  # every command rejects a malformed command line


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("readme")
    store = root / "store.duckdb"
    assert _run(["replay", "none_version_bump", "--scale", "0.05", "--db", str(store)])[0] == 0
    foreign = root / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    text = root / "notes.txt"
    text.write_text("not telemetry\n")
    empty = root / "empty.jsonl"
    empty.write_text("")
    tasks = root / "tasks.jsonl"
    sample = {"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.001}
    tasks.write_text(
        "".join(
            json.dumps({"task_id": f"t{i}", "arms": {"cheap": [{"correct": i % 2 == 0, **sample}] * 3}}) + "\n"
            for i in range(8)
        )
    )
    return {
        "store": str(store), "foreign": str(foreign), "text": str(text), "empty": str(empty),
        "tasks": str(tasks), "new": str(root / "new.duckdb"), "demo": str(root / "demo.duckdb"),
    }  # fmt: skip


def _canary_store_error_code() -> int:
    """4 once the canary declares "could not evaluate" in its help; until then a store error exits 1."""
    return 4 if 4 in declared_codes("canary") else 1


#: (command, code) -> the argument list that must exit with that code ({name} = a file above).
PROBES: dict[tuple[str, int], list[str]] = {
    ("demo", 0): ["demo", "--scale", "0.05", "--db", "{demo}"],
    ("demo", 1): ["demo", "--db", "{foreign}"],
    ("demo", 2): ["demo", "--format", "yaml"],
    ("serve", 1): ["serve", "--db", "{foreign}"],
    ("serve", 2): ["serve", "--http-port", "http"],
    ("ingest", 0): ["ingest", "--db", "{new}", "{empty}"],
    ("ingest", 1): ["ingest", "--db", "{new}", "{text}"],
    ("ingest", 2): ["ingest"],
    ("diagnose", 0): ["diagnose", "--db", "{store}"],
    ("diagnose", 1): ["diagnose", "--db", "{foreign}"],
    ("diagnose", 2): ["diagnose", "--db", "{store}", "--deploy-at", "1768468200000"],
    ("canary", 0): ["canary", "--db", "{store}", "--slo", "ttft_p50=1000s"],
    ("canary", 1): ["canary", "--db", "{store}", "--slo", "ttft_p50=1ms"],
    ("canary", 2): ["canary", "--db", "{store}"],
    ("canary", 3): ["canary", "--db", "{store}", "--slo", "ttft_p99=2s"],
    ("canary", 4): ["canary", "--db", "{foreign}", "--slo", "ttft_p99=2s"],
    ("replay", 0): ["replay", "--list"],
    ("replay", 1): ["replay", "no_such_scenario"],
    ("replay", 2): ["replay"],
    ("tui", 2): ["tui", "--db", "{store}", "--url", "http://127.0.0.1:9"],
    ("rules", 0): ["rules"],
    ("rules", 2): ["rules", "--format", "yaml"],
    ("policy", 0): ["policy", "evaluate", "--tasks", "{tasks}"],
    ("policy", 1): ["policy", "evaluate", "--tasks", "{text}"],
    ("policy", 2): ["policy", "evaluate"],
}


def test_every_documented_exit_code_has_a_probe() -> None:
    documented = {(command, code) for command, codes in readme_commands().items() for code in codes}
    assert documented == set(PROBES) | set(UNPROBED)


@pytest.mark.parametrize(("command", "code"), sorted(PROBES))
def test_each_documented_exit_code_is_what_the_cli_does(command: str, code: int, files: dict[str, str]) -> None:
    argv = [arg.format(**files) for arg in PROBES[(command, code)]]
    expected = _canary_store_error_code() if (command, code) == ("canary", 4) else code
    got, _, err = _run(argv)
    assert got == expected, (argv, err)
    assert "Traceback" not in err
