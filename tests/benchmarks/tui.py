"""Benchmark: first paint of the incident console on a 10-million-span store.

Builds (once, cached under the temp dir) the synthetic incident store of
``tests/tui/tui_synth.py`` with 10 M spans, then starts the console headless
at 80x24 and measures the time from App start to the overview tiles showing
p99 figures, and how long each key action takes to answer once the data is in
(pilot press to settled screen, cosmetic animations off).

    python tests/benchmarks/tui.py [--spans 10000000] [--db PATH]

Last line: ``tui: first_paint_s=X``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "tui"))

from tui_synth import build_store  # noqa: E402


async def measure(db: Path) -> tuple[float, dict[str, float]]:
    from sre_agent.tui.app import IncidentApp
    from sre_agent.tui.source import LocalSource
    from sre_agent.tui.widgets import TileView

    started = time.perf_counter()
    app = IncidentApp(LocalSource(str(db)))
    # Pilot's press() waits for animations to end (the tab underline slides for ~0.3 s); the
    # answer to a key is the state change, so measure with cosmetic animations off.
    app.animation_level = "none"
    keys: dict[str, float] = {}
    async with app.run_test(size=(80, 24)) as pilot:
        tile = app.query_one("#tile-e2e", TileView)
        while "p99" not in str(tile.render()):
            await asyncio.sleep(0.01)
            if time.perf_counter() - started > 60:
                raise TimeoutError("no figures within 60 s")
        first_paint = time.perf_counter() - started
        await app.workers.wait_for_complete()
        await pilot.pause()
        keys["rest_loaded_s"] = time.perf_counter() - started
        for key in ("f", "s", "t", "o", "question_mark", "escape", "c"):
            t0 = time.perf_counter()
            await pilot.press(key)
            keys[key] = time.perf_counter() - t0
        await app.workers.wait_for_complete()
    return first_paint, keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--db", type=Path, default=None)
    args = parser.parse_args()
    db = args.db or Path(tempfile.gettempdir()) / f"sre-agent-tui-bench-{args.spans}.duckdb"
    if not db.exists():
        t0 = time.perf_counter()
        build_store(db, n_requests=args.spans // 3)
        print(f"built {db} ({args.spans} spans) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    first_paint, keys = asyncio.run(measure(db))
    for key, seconds in keys.items():
        print(
            f"tui: key {key!r} answered in {seconds * 1000:.0f} ms"
            if len(key) <= 13 and key != "rest_loaded_s"
            else f"tui: {key}={seconds:.2f}"
        )
    print(f"tui: first_paint_s={first_paint:.2f}")


if __name__ == "__main__":
    main()
