"""Baseline/candidate selection as the command line and API express it.

A :class:`Selection` is what the user asked for (CONTRACTS section 2); it
is resolved against a store into two concrete populations elsewhere
(``sre_agent.analysis.compare``). Times are Unix epoch nanoseconds throughout.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sre_agent.analysis.rules_api import SIDES
from sre_agent.errors import UsageError

__all__ = [
    "Selection",
    "Window",
    "format_time",
    "parse_duration",
    "parse_time",
    "parse_window",
]

Mode = Literal["deploy_at", "versions", "windows", "since_last_deploy"]

_NS = 1_000_000_000
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_UNIT_NS = {"ms": 1_000_000, "s": _NS, "m": 60 * _NS, "min": 60 * _NS, "h": 3600 * _NS, "d": 86400 * _NS}
# Times are accepted from 1970 to 2200-01-01: epoch nanoseconds are stored as signed 64-bit
# integers, which end in 2262, and a window is added on top. A number past it is almost
# always Unix ms, µs or ns.
_MAX_TIME_S = 7_258_118_400
# Longest duration: ten years, so that a time plus a window still fits 64-bit nanoseconds.
_MAX_DURATION_NS = 10 * 365 * 86400 * _NS


@dataclass(frozen=True)
class Window:
    """A half-open time interval ``[start_ns, end_ns)``."""

    start_ns: int
    end_ns: int

    def __post_init__(self) -> None:
        if self.end_ns <= self.start_ns:
            raise UsageError(
                f"window end {format_time(self.end_ns)} is not after its start {format_time(self.start_ns)}"
            )

    @property
    def seconds(self) -> float:
        """Length of the window in seconds."""
        return (self.end_ns - self.start_ns) / _NS


@dataclass(frozen=True)
class Selection:
    """What to compare: one of four modes, plus optional filters.

    Attributes:
        mode: ``deploy_at`` (before/after a time), ``versions`` (concurrent
            ``service.version`` pair), ``windows`` (explicit intervals) or
            ``since_last_deploy`` (latest deploy marker or version change).
        deploy_at_ns: the deploy time for ``deploy_at``.
        window_ns: length of each side for ``deploy_at`` and
            ``since_last_deploy``; ``None`` means equal lengths capped by the data.
        baseline_version / candidate_version: for ``versions``.
        baseline / candidate: explicit windows for ``windows``; optional time
            bounds for ``versions``.
        service: restrict to spans whose ``service.name`` equals this.
        where: ``(attribute, value)`` equality filters; the attribute is a
            canonical column name or any resource/span attribute key.
    """

    mode: Mode
    deploy_at_ns: int | None = None
    window_ns: int | None = None
    baseline_version: str | None = None
    candidate_version: str | None = None
    baseline: Window | None = None
    candidate: Window | None = None
    service: str | None = None
    where: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.mode == "deploy_at" and self.deploy_at_ns is None:
            raise UsageError("--deploy-at needs a time")
        if self.mode == "versions" and not (self.baseline_version and self.candidate_version):
            raise UsageError("--baseline-version and --candidate-version go together")
        if self.mode == "windows" and (self.baseline is None or self.candidate is None):
            raise UsageError("--baseline START..END and --candidate START..END go together")
        if self.window_ns is not None and self.window_ns <= 0:
            raise UsageError("--window must be positive")
        if self.window_ns is not None and self.mode not in ("deploy_at", "since_last_deploy"):
            # The version and explicit-window modes have no deploy to size a window around.
            raise UsageError("--window sizes each side of a deploy: use it with --deploy-at or --since-last-deploy")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (used by the HTTP API and in reports)."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.deploy_at_ns is not None:
            out["deploy_at"] = format_time(self.deploy_at_ns)
        if self.window_ns is not None:
            out["window_s"] = self.window_ns / _NS
        if self.baseline_version is not None:
            out["baseline_version"] = self.baseline_version
            out["candidate_version"] = self.candidate_version
        for side in SIDES:
            w = getattr(self, side)
            if w is not None:
                out[side] = f"{format_time(w.start_ns)}..{format_time(w.end_ns)}"
        if self.service is not None:
            out["service"] = self.service
        if self.where:
            out["where"] = dict(self.where)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Selection:
        """Inverse of :meth:`to_dict`; raises :class:`UsageError` on bad input."""
        known = {
            "mode", "deploy_at", "window_s", "window", "baseline_version", "candidate_version",
            "baseline", "candidate", "service", "where",
        }  # fmt: skip
        unknown = set(data) - known
        if unknown:
            raise UsageError(f"unknown selection keys: {', '.join(sorted(unknown))}")
        mode = data.get("mode")
        if mode is None:
            if "deploy_at" in data:
                mode = "deploy_at"
            elif "baseline_version" in data:
                mode = "versions"
            elif "baseline" in data:
                mode = "windows"
            else:
                mode = "since_last_deploy"
        if mode not in ("deploy_at", "versions", "windows", "since_last_deploy"):
            raise UsageError(f"unknown selection mode {mode!r}")
        window_ns: int | None = None
        if "window_s" in data:
            window_ns = _seconds_ns(data["window_s"])
        elif "window" in data:
            window_ns = parse_duration(str(data["window"]))
        where = data.get("where") or {}
        if not isinstance(where, dict):
            raise UsageError("selection 'where' must be an object of attribute: value")
        return cls(
            mode=cast(Mode, mode),
            deploy_at_ns=parse_time(str(data["deploy_at"])) if "deploy_at" in data else None,
            window_ns=window_ns,
            baseline_version=data.get("baseline_version"),
            candidate_version=data.get("candidate_version"),
            baseline=parse_window(str(data["baseline"])) if data.get("baseline") else None,
            candidate=parse_window(str(data["candidate"])) if data.get("candidate") else None,
            service=data.get("service"),
            where=tuple((str(k), str(v)) for k, v in where.items()),
        )


def parse_time(text: str) -> int:
    """Parse ISO 8601 (with offset or ``Z``) or Unix seconds into epoch ns.

    A naive ISO time (no offset) is taken as UTC. Times before 1970 or after
    2200 are usage errors; a number that large is named as the
    Unix milliseconds, microseconds or nanoseconds it most likely is.

    >>> parse_time("1700000000")
    1700000000000000000
    >>> parse_time("2023-11-14T22:13:20Z")
    1700000000000000000
    """
    s = text.strip()
    try:
        seconds = float(s)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not math.isfinite(seconds):
            raise UsageError(f"cannot read time {text!r}: use ISO 8601 (2026-12-02T15:00:00Z) or Unix seconds")
        _check_time_range(text, seconds)
        return round(seconds * _NS)
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(f"cannot read time {text!r}: use ISO 8601 (2026-12-02T15:00:00Z) or Unix seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    _check_time_range(text, dt.timestamp())
    return int(dt.timestamp()) * _NS + dt.microsecond * 1000


def _check_time_range(text: str, seconds: float) -> None:
    """Reject times outside 1970..2200, naming the unit a too-large number probably has."""
    if seconds < 0:
        raise UsageError(f"time {text!r} is before 1970: give ISO 8601 or Unix seconds")
    if seconds <= _MAX_TIME_S:
        return
    for unit, factor in (("milliseconds", 1e3), ("microseconds", 1e6), ("nanoseconds", 1e9)):
        if seconds / factor <= _MAX_TIME_S:
            raise UsageError(
                f"time {text!r} looks like Unix {unit}; give Unix seconds ({seconds / factor:.0f}) or ISO 8601"
            )
    raise UsageError(f"time {text!r} is after 2200: give ISO 8601 or Unix seconds")


def _seconds_ns(value: Any) -> int:
    """A JSON number of seconds (``window_s``) as ns, checked like :func:`parse_duration`."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"window_s {value!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds * _NS > _MAX_DURATION_NS:
        raise UsageError(f"window_s {value!r} is not a usable number of seconds")
    return round(seconds * _NS)


def parse_duration(text: str) -> int:
    """Parse ``90s``, ``15m``, ``2h``, ``1d``, ``250ms`` or bare seconds into ns.

    >>> parse_duration("15m")
    900000000000
    """
    m = _DURATION_RE.match(text)
    if not m:
        raise UsageError(f"cannot read duration {text!r}: use e.g. 250ms, 30s, 15m, 2h, 1d")
    value, unit = float(m.group(1)), m.group(2) or "s"
    duration_ns = round(value * _UNIT_NS[unit])
    if duration_ns > _MAX_DURATION_NS:
        raise UsageError(f"duration {text!r} is longer than ten years")
    return duration_ns


def parse_window(text: str) -> Window:
    """Parse ``START..END`` (each a :func:`parse_time` value) into a Window."""
    if ".." not in text:
        raise UsageError(f"cannot read window {text!r}: use START..END")
    start, end = text.split("..", 1)
    return Window(parse_time(start), parse_time(end))


def format_time(ns: int) -> str:
    """Epoch ns as ISO 8601 UTC with millisecond precision and ``Z``."""
    dt = datetime.fromtimestamp(ns / _NS, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
