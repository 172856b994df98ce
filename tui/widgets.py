"""Display widgets of the console: SLO tiles, the p99 timeline, stage table, waterfall.

Each widget is a ``Static`` fed one explore dataclass through ``show(...)``;
the text it renders comes from pure ``*_text`` functions so tests (and the
tmux check) can compute the exact figures expected on screen.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from sre_agent.analysis.explore import STAGES, Overview, StageBreakdown, Tile, Timeline, WaterfallSpan

__all__ = [
    "RateTile",
    "StagesView",
    "TileView",
    "TimelineView",
    "WaterfallView",
    "fmt_pct",
    "fmt_rate",
    "fmt_s",
    "fmt_share",
    "fmt_slo",
    "sparkline",
]

_BLOCKS = "▁▂▃▄▅▆▇█"


def fmt_s(seconds: float | None) -> str:
    """Seconds for a tile: ``412ms``, ``1.57s``, ``13.3s``; ``–`` when there is no value."""
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10:
        return f"{seconds:.2f}s"
    return f"{seconds:.1f}s"


def fmt_slo(seconds: float) -> str:
    """A target in its shortest form: ``2s``, ``100ms``."""
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def fmt_rate(per_s: float | None) -> str:
    """A rate per second with three significant figures."""
    return "–" if per_s is None else f"{per_s:.3g}"


def fmt_pct(fraction: float | None) -> str:
    """A fraction as a percentage with two decimals."""
    return "–" if fraction is None else f"{fraction * 100:.2f}%"


def fmt_share(fraction: float | None) -> str:
    """A share as a whole percentage: ``72%``; ``–`` when undefined."""
    return "–" if fraction is None else f"{fraction * 100:.0f}%"


def tile_lines(tile: Tile) -> tuple[str, str]:
    """The two lines of a latency tile: p50 and p99, baseline→candidate."""
    return (
        f"p50 {fmt_s(tile.p50_baseline)}→{fmt_s(tile.p50_candidate)}",
        f"p99 {fmt_s(tile.p99_baseline)}→{fmt_s(tile.p99_candidate)}",
    )


class TileView(Static):
    """One latency SLO tile; its border colour follows ``Tile.status``."""

    def show(self, tile: Tile) -> None:
        self.border_title = tile.label
        ratio = tile.p99_ratio
        parts = [f"×{ratio:.1f}" if ratio is not None else "", f"SLO {fmt_slo(tile.slo_s)}" if tile.slo_s else ""]
        self.border_subtitle = " ".join(p for p in parts if p)
        for status in ("ok", "regressed", "breach", "nodata"):
            self.set_class(tile.status == status, f"-{status}")
        self.update("\n".join(tile_lines(tile)))


class RateTile(Static):
    """Request rate, error rate or goodput, baseline→candidate on one line."""

    def show(self, label: str, text: str, worse: bool) -> None:
        self.border_title = label
        self.set_class(worse, "-regressed")
        self.set_class(not worse, "-ok")
        self.update(text)


def rate_texts(ov: Overview) -> list[tuple[str, str, bool]]:
    """``(label, text, got_worse)`` for the rate, error and goodput tiles."""
    err_b, err_c = ov.error_rate_baseline, ov.error_rate_candidate
    return [
        ("requests/s", f"{fmt_rate(ov.rate_baseline)}→{fmt_rate(ov.rate_candidate)}", False),
        (
            "errors",
            f"{fmt_pct(err_b)}→{fmt_pct(err_c)}",
            err_b is not None and err_c is not None and err_c > err_b * 1.2,
        ),
        (
            "goodput/s",
            f"{fmt_rate(ov.goodput_baseline)}→{fmt_rate(ov.goodput_candidate)}",
            ov.goodput_candidate < 0.95 * ov.goodput_baseline,
        ),
    ]


def sparkline(values: list[float | None], top: float) -> str:
    """One block character per value, scaled to ``top``; a space for an empty bucket."""
    if top <= 0:
        return "".join(" " if v is None else _BLOCKS[0] for v in values)
    return "".join(" " if v is None else _BLOCKS[min(7, int(v / top * 7.999))] for v in values)


def timeline_text(tl: Timeline) -> Text:
    """Sparklines of p99 (one per series) and a marker row with each deploy under its bucket."""
    values = [v for series in tl.series.values() for v in series if v is not None]
    top = max(values, default=0.0)
    width = max(len(s) for s in tl.series.values()) if tl.series else 0
    text = Text()
    name_width = max((len(n) for n in tl.series), default=0) if len(tl.series) > 1 else 0
    for name, series in tl.series.items():
        if name_width:
            text.append(f"{name:<{name_width}} ", style="dim")
        for i, ch in enumerate(sparkline(series, top)):
            after = any(d.bucket <= i for d in tl.deploys)
            text.append(ch, style="bold" if after else "")
        text.append(f" {fmt_s(top)}\n", style="dim")
    markers = [" "] * width
    for d in tl.deploys:
        if 0 <= d.bucket < width:
            label = f"▲{d.version}"
            for j, ch in enumerate(label):
                if d.bucket + j < width:
                    markers[d.bucket + j] = ch
    text.append(" " * name_width + "".join(markers))
    return text


class TimelineView(Static):
    """p99 over time with deploy markers."""

    def show(self, tl: Timeline, label: str) -> None:
        self.border_title = f"{label} p99 over time"
        self.update(timeline_text(tl))


def stages_table(sb: StageBreakdown) -> Table:
    """Mean seconds per stage of each side's tail, and the change."""
    table = Table(box=None, pad_edge=False, expand=False, header_style="bold")
    table.add_column(f"tail (≥p99 {sb.metric})")
    for stage in STAGES:
        table.add_column(stage, justify="right")
    table.add_row(f"baseline n={sb.tail_requests_baseline}", *(fmt_s(sb.baseline.get(s)) for s in STAGES))
    table.add_row(f"candidate n={sb.tail_requests_candidate}", *(fmt_s(sb.candidate.get(s)) for s in STAGES))
    deltas = []
    for stage in STAGES:
        delta = sb.candidate.get(stage, 0.0) - sb.baseline.get(stage, 0.0)
        style = "bold red" if delta > 0.1 * max(sb.baseline.get(stage, 0.0), 0.01) else ""
        deltas.append(Text(("+" if delta >= 0 else "-") + fmt_s(abs(delta)), style=style))
    table.add_row("change", *deltas)
    return table


class StagesView(Static):
    """Stage breakdown of the tail."""

    def show(self, sb: StageBreakdown) -> None:
        self.update(stages_table(sb))


def waterfall_text(spans: list[WaterfallSpan], width: int = 36) -> Text:
    """One line per span: indented name, a bar placed on the trace's time axis, duration."""
    text = Text()
    if not spans:
        return Text("no spans for this trace", style="dim")
    total = max((s.offset_s + s.duration_s for s in spans), default=0.0) or 1e-9
    for s in spans:
        name = ("  " * s.depth + s.name)[:26]
        start = min(width - 1, int(s.offset_s / total * width))
        length = max(1, round(s.duration_s / total * width))
        bar = " " * start + "█" * min(length, width - start)
        style = "red" if s.status == "error" else ("bold" if s.is_engine else "")
        text.append(f"{name:<26} ")
        text.append(f"{bar:<{width}}", style=style)
        text.append(f" {fmt_s(s.duration_s):>6}\n")
    return text


class WaterfallView(Static):
    """The span waterfall of one exemplar trace."""

    def show(self, trace_id: str, spans: list[WaterfallSpan]) -> None:
        self.border_title = f"trace {trace_id[:16]}…"
        self.update(waterfall_text(spans))
