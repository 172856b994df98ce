"""Baseline/candidate selection as the command line and API express it.

A :class:`Selection` is what the user asked for (CONTRACTS section 2); it
is resolved against a store into two concrete populations elsewhere
(``sre_agent.compare``). Times are Unix epoch nanoseconds throughout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

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
        for side in ("baseline", "candidate"):
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
            window_ns = int(float(data["window_s"]) * _NS)
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

    A naive ISO time (no offset) is taken as UTC.

    >>> parse_time("1700000000")
    1700000000000000000
    >>> parse_time("2023-11-14T22:13:20Z")
    1700000000000000000
    """
    s = text.strip()
    try:
        return round(float(s) * _NS)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(f"cannot read time {text!r}: use ISO 8601 (2026-12-02T15:00:00Z) or Unix seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp()) * _NS + dt.microsecond * 1000


def parse_duration(text: str) -> int:
    """Parse ``90s``, ``15m``, ``2h``, ``1d``, ``250ms`` or bare seconds into ns.

    >>> parse_duration("15m")
    900000000000
    """
    m = _DURATION_RE.match(text)
    if not m:
        raise UsageError(f"cannot read duration {text!r}: use e.g. 250ms, 30s, 15m, 2h, 1d")
    value, unit = float(m.group(1)), m.group(2) or "s"
    return round(value * _UNIT_NS[unit])


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
