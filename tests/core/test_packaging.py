"""The wheel installs rules/, replays/ and tui/ under sre_agent, never as top-level names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (found,) = out.glob("sre_agent-*.whl")
    return found


def test_wheel_installs_into_a_fresh_venv_under_one_namespace(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", purelib, str(wheel)],
        check=True,
    )
    top_level = {p.name for p in Path(purelib).iterdir() if not p.name.endswith((".dist-info", ".pth"))}
    assert "sre_agent" in top_level
    assert not top_level & {"rules", "replays", "tui", "tests"}, top_level
    installed = Path(purelib) / "sre_agent"
    for sub in ("rules", "replays", "tui"):
        assert (installed / sub / "__init__.py").is_file(), sub
        assert not (installed / sub).is_symlink()
    assert (installed / "py.typed").is_file()
    # The fresh interpreter finds the installed copy (not the checkout) for every namespace.
    probe = subprocess.run(
        [str(python), "-c", "import sre_agent.rules, sre_agent.replays, sre_agent.tui as t; print(t.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert probe.stdout.strip().startswith(purelib)


def test_console_script_is_declared(wheel: Path) -> None:
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        (entry_points,) = [n for n in zf.namelist() if n.endswith("entry_points.txt")]
        text = zf.read(entry_points).decode()
    assert "sre-agent = sre_agent.cli:run" in text
    # Built-in rules ship through the same entry-point group third-party rules use.
    assert "[sre_agent.rules]" in text
    assert "stages = sre_agent.rules.stages:stages" in text
