"""Property: whatever a user types, the CLI answers with readable lines and a documented exit code.

Hypothesis builds wrong (and some right) argument lists for the commands that
read or load data, pointing at real files: a real store, a DuckDB file that is
not a store, empty and text files, missing paths, a directory, and URLs on a
closed loopback port. Each list runs through the CLI entry function in-process
(fast) with stderr captured; a few fixed cases also run as real subprocesses
of the console script. Never a traceback, always a code CONTRACTS section 2 lists.

Commands left out: ``serve`` and ``tui`` would start a server or a full-screen
app on the first valid argument list, and ``demo`` takes seconds per run.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sre_agent.cli import main

#: Exit codes per command (CONTRACTS section 2; 2 is a usage error everywhere).
EXIT_CODES: dict[str, frozenset[int]] = {
    "diagnose": frozenset({0, 1, 2}),
    "canary": frozenset({0, 1, 2, 3, 4}),
    "ingest": frozenset({0, 1, 2}),
    "replay": frozenset({0, 1, 2}),
    "rules": frozenset({0, 2}),
    "policy": frozenset({0, 1, 2}),
}


@dataclass(frozen=True)
class Paths:
    """The files the generated arguments point at."""

    store: str
    foreign: str
    empty_duckdb: str
    zero_bytes: str
    text: str
    noise: str
    missing: str
    directory: str
    closed_url: str


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    root = tmp_path_factory.mktemp("no_tracebacks")
    store = root / "store.duckdb"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["replay", "none_version_bump", "--scale", "0.05", "--db", str(store)]) == 0
    foreign = root / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    empty_duckdb = root / "empty.duckdb"
    duckdb.connect(str(empty_duckdb)).close()
    zero = root / "zero.jsonl"
    zero.write_bytes(b"")
    text = root / "notes.txt"
    text.write_text("not telemetry\n{ nor json\n")
    noise = root / "noise.bin"
    noise.write_bytes(os.urandom(2048))
    directory = root / "folder"
    directory.mkdir()
    return Paths(
        store=str(store),
        foreign=str(foreign),
        empty_duckdb=str(empty_duckdb),
        zero_bytes=str(zero),
        text=str(text),
        noise=str(noise),
        missing=str(root / "missing" / "nothing.duckdb"),
        directory=str(directory),
        closed_url=f"http://127.0.0.1:{_closed_port()}",
    )


# ------------------------------------------------------------------ argument strategies

TIMES = [
    "2026-01-15T09:01:00Z", "1768467660", "1768468200000", "1768468200000000000", "-1", "nan", "inf", "1e400",
    "yesterday", "", "2026-13-45", "0", "99999999999",
]  # fmt: skip
DURATIONS = ["30s", "15m", "0", "-5m", "1e9d", "fortnight", "99999999d", "250ms", ""]
WINDOWS = ["1768467600..1768467660", "1768467660..1768467600", "..", "a..b", "1768467600", "2026-01-15T09:00Z..now"]
WORDS = ["v1", "2026.01.15-1", "", "vllm", "nope", "=", "k=v", "tenant.id=acme", "--", "-x", "ü", "a" * 300]
SLOS = ["ttft_p99=2s", "itl_p99=80ms", "error_rate=1%", "goodput=0.95", "ttft_p99", "p99=2s", "ttft_p99=-1s", "x=y"]
NUMBERS = ["0", "-1", "2", "0.5", "nan", "inf", "1e400", "ten", ""]


def _pick(values: list[str]) -> st.SearchStrategy[str]:
    """Mostly the listed values (the first ones are valid), sometimes any text."""
    return st.one_of(st.sampled_from(values), st.sampled_from(values[:2]), st.text(max_size=12))


def _flat(lists: list[list[str]]) -> list[str]:
    return [item for part in lists for item in part]


def _store_options(p: Paths) -> st.SearchStrategy[list[str]]:
    # The real store is drawn most often, so that many lists get past the store to the analysis.
    db = st.sampled_from(
        [p.store] * 8 + [p.foreign, p.empty_duckdb, p.zero_bytes, p.text, p.missing, p.directory, p.noise]
    ).map(lambda path: ["--db", path])
    url = st.sampled_from([p.closed_url, "notaurl", "http://", "http://127.0.0.1:99999"]).map(lambda u: ["--url", u])
    return st.one_of(db, st.lists(st.one_of(db, url, st.just(["--token", "t"])), max_size=2).map(_flat))


def _selection_options() -> st.SearchStrategy[list[str]]:
    option = st.one_of(
        _pick(TIMES).map(lambda t: ["--deploy-at", t]),
        _pick(DURATIONS).map(lambda d: ["--window", d]),
        _pick(WORDS).map(lambda v: ["--baseline-version", v]),
        _pick(WORDS).map(lambda v: ["--candidate-version", v]),
        _pick(WINDOWS).map(lambda w: ["--baseline", w]),
        _pick(WINDOWS).map(lambda w: ["--candidate", w]),
        st.just(["--since-last-deploy"]),
        _pick(WORDS).map(lambda s: ["--service", s]),
        _pick(WORDS).map(lambda w: ["--where", w]),
        st.sampled_from(["text", "json", "markdown", "yaml"]).map(lambda f: ["--format", f]),
    )
    return st.lists(option, max_size=4).map(_flat)


def _command(p: Paths) -> st.SearchStrategy[list[str]]:
    files = st.lists(st.sampled_from([p.zero_bytes, p.text, p.noise, p.missing, p.directory, p.store]), max_size=3)
    diagnose = st.tuples(_store_options(p), _selection_options()).map(lambda t: ["diagnose", *t[0], *t[1]])
    canary_gate = st.lists(
        st.one_of(
            _pick(SLOS).map(lambda s: ["--slo", s]),
            _pick(SLOS).map(lambda s: ["--max-regression", s.replace("2s", "15%")]),
            _pick(NUMBERS).map(lambda n: ["--min-samples", n]),
            _pick(NUMBERS).map(lambda n: ["--alpha", n]),
            st.just(["--dry-run"]),
        ),
        max_size=3,
    ).map(_flat)
    gate = st.one_of(canary_gate, canary_gate.map(lambda g: ["--slo", "ttft_p99=2s", *g]))
    canary = st.tuples(_store_options(p), _selection_options(), gate).map(lambda t: ["canary", *t[0], *t[1], *t[2]])
    ingest = st.tuples(
        st.sampled_from([["--db", p.foreign], ["--db", p.missing], ["--url", p.closed_url], ["--db", p.directory]]),
        files,
    ).map(lambda t: ["ingest", *t[0], *t[1]])
    replay = st.tuples(
        st.sampled_from(["no_such_scenario", p.text, p.noise, p.directory, "none_version_bump", ""]),
        st.sampled_from(
            [
                ["--endpoint", p.closed_url],
                ["--endpoint", "grpc://127.0.0.1:1"],
                ["--endpoint", "ftp://x"],
                ["--out", p.missing],
                ["--db", p.foreign],
                ["--scale", "0"],
                ["--speed", "nan"],
            ]
        ),
    ).map(lambda t: ["replay", t[0], *t[1]])
    other = st.sampled_from(
        [
            ["rules", "--format", "yaml"],
            ["policy", "evaluate", "--tasks", p.text],
            ["policy", "evaluate", "--tasks", p.missing],
            ["policy", "evaluate", "--tasks", p.zero_bytes, "--deadline", "-1"],
            ["policy", "evaluate"],
            ["nonsense"],
            [],
        ]
    )
    return st.one_of(diagnose, canary, ingest, replay, other)


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help and --version exit through argparse
            code = int(exc.code or 0)
    return code, err.getvalue()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_argument_list_gives_a_traceback_or_an_undocumented_exit_code(paths: Paths, data: st.DataObject) -> None:
    argv = data.draw(_command(paths), label="argv")
    code, err = _run(argv)
    assert "Traceback" not in err
    command = argv[0] if argv and argv[0] in EXIT_CODES else None
    allowed = EXIT_CODES[command] if command else frozenset({2})
    assert code in allowed, (argv, code, err)
    if code not in (0, 3) and not (command == "canary" and code == 1):
        # A failure says why on stderr (canary's 1 is a "fail" verdict, printed on stdout).
        assert err.strip(), argv


# ------------------------------------------------------------------ the real console script

SCRIPT = shutil.which("sre-agent", path=str(Path(sys.executable).parent))


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["diagnose", "--db", "{store}", "--deploy-at", "1768468200000"], 2, "milliseconds"),
        (["diagnose", "--db", "{foreign}"], 1, "not an sre-agent store"),
        (["diagnose", "--db", "{store}", "--url", "{url}"], 2, "not both"),
        (["ingest", "--db", "{new}", "{noise}"], 1, "not a telemetry file"),
        (["replay", "none_version_bump", "--endpoint", "{url}"], 1, "cannot reach the OTLP endpoint"),
    ],
)
def test_the_console_script_answers_in_one_line(
    paths: Paths, tmp_path: Path, argv: list[str], code: int, says: str
) -> None:
    assert SCRIPT is not None, "the sre-agent console script is installed next to the interpreter"
    values = {
        "store": paths.store, "foreign": paths.foreign, "url": paths.closed_url,
        "noise": paths.noise, "new": str(tmp_path / "new.duckdb"),
    }  # fmt: skip
    done = subprocess.run(
        [SCRIPT, *(arg.format(**values) for arg in argv)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
