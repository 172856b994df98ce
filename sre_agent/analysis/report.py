"""The diagnosis report: CONTRACTS section 3 JSON, terminal text and Markdown."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from sre_agent.analysis.rules_api import SHARE_HEADLINES, Evidence, Finding, MetricEstimate, Regression
from sre_agent.analysis.selection import Selection, format_time

__all__ = ["SCHEMA", "Report", "render_dict"]

SCHEMA: Final[str] = "sre-agent/diagnosis/v1"
#: Quantiles listed in the report's ``metrics`` array (CONTRACTS: 0.5 and 0.99).
REPORTED_QUANTILES: Final[tuple[float, ...]] = (0.5, 0.99)


def _num(x: Any) -> Any:
    """JSON-safe numbers: floats rounded to 6 significant digits, NaN/inf as null."""
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {str(k): _num(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_num(v) for v in x]
    return x


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.2f} s"


def _fmt_delta(x: float) -> str:
    """A signed change in the unit :func:`_fmt_s` would pick for its size: ``+23.0 ms``, ``-1.20 s``."""
    if x == 0:
        return "0"
    return ("+" if x > 0 else "-") + _fmt_s(abs(x))


def _fmt_ci(ci: tuple[float, float] | None) -> str:
    """A 95 % CI of a change in seconds, in readable units: ``+23.0 ms .. +231.6 ms``."""
    return "n/a" if ci is None else f"{_fmt_delta(ci[0])} .. {_fmt_delta(ci[1])}"


def _fmt_filter(flt: Mapping[str, Any], code: bool = False) -> str:
    """``{"service": "vllm"}`` as ``service=vllm`` (backquoted for Markdown when ``code``)."""
    tick = "`" if code else ""
    return ", ".join(f"{tick}{k}={v}{tick}" for k, v in flt.items())


#: Prefixes of the resolution notes (sre_agent.analysis.compare) that name the deploy a comparison is about.
_DEPLOY_NOTES: Final[tuple[tuple[str, str], ...]] = (
    ("deploy marker: ", "before vs after the deploy of {} (deploy marker)"),
    ("service.version change to ", "before vs after the service.version change to {}"),
)

#: What the ``regressed`` column of the metric table means, printed under it.
REGRESSED_LEGEND: Final[str] = (
    "regressed: rose beyond noise (95% CI of the change above 0, or more requests beyond the baseline tail "
    "quantile than chance allows) and by enough to matter"
)


def _fmt_any(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "n/a" if x is None else str(x)


@dataclass
class Report:
    """A ranked diagnosis. ``to_dict()`` is the CONTRACTS section 3 object.

    Attributes:
        selection: what was compared.
        baseline / candidate: the resolved windows (start, end, requests, filter).
        regression: the headline metric.
        estimates: every metric x quantile with CIs.
        findings: ranked; the first is ``none`` when nothing regressed.
        notes: how data was chosen or degraded (shown to people, included in JSON).
        errors: rules that failed to load or run.
        timings: seconds spent, total and per rule.
    """

    selection: Selection | None
    baseline: dict[str, Any]
    candidate: dict[str, Any]
    regression: Regression
    estimates: list[MetricEstimate]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    #: Whether ``estimates`` carry ``significant`` and ``source``; the JSON form has neither, so a
    #: report rebuilt by :meth:`from_dict` leaves those columns out rather than guess them.
    estimate_details: bool = True

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """Rebuild a report from its :meth:`to_dict` JSON (e.g. an HTTP API answer) for rendering."""
        r = data.get("regression") or {}
        regression = Regression(
            str(r.get("metric", "e2e")), float(r.get("quantile") or 0.99), r.get("baseline"), r.get("candidate"),
            tuple(r["ci"]) if r.get("ci") else None, bool(r.get("significant")),
        )  # fmt: skip
        switch = r.get("quantile_switch") or {}
        if switch:
            reason = str(switch.get("reason", ""))
            regression = replace(regression, switched_from=switch.get("from"), switch_reason=reason)
        estimates = [
            MetricEstimate(str(m["name"]), float(m["quantile"]), m.get("baseline"), m.get("candidate"),
                           tuple(m["ci"]) if m.get("ci") else None)
            for m in data.get("metrics", [])
        ]  # fmt: skip
        findings = []
        for f in data.get("findings", []):
            confidence = float(f.get("confidence") or 0.0)
            findings.append(
                Finding(
                    cause=str(f["cause"]), title=str(f.get("title", "")),
                    explained=float(f.get("score") or 0.0) / confidence if confidence else 0.0,
                    confidence=confidence, stage=f.get("stage"), scope=dict(f.get("scope") or {}),
                    evidence=tuple(Evidence(str(e.get("signal")), e.get("baseline"), e.get("candidate"),
                                            str(e.get("detail") or "")) for e in f.get("evidence", [])),
                    next_check=str(f.get("next_check") or ""),
                )
            )  # fmt: skip
        return cls(
            selection=None, baseline=dict(data.get("baseline") or {}), candidate=dict(data.get("candidate") or {}),
            regression=regression, estimates=estimates, findings=findings,
            notes=list(data.get("notes") or []), errors=list(data.get("errors") or []), estimate_details=False,
        )  # fmt: skip

    @property
    def top(self) -> Finding | None:
        """The first-ranked finding (``None`` when a regression is unexplained)."""
        return self.findings[0] if self.findings else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of CONTRACTS section 3 (plus ``notes`` and ``errors``, always lists)."""
        r = self.regression
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "regression": {
                "metric": r.metric,
                "quantile": None if r.metric in SHARE_HEADLINES else r.quantile,
                "baseline": r.baseline,
                "candidate": r.candidate,
                "ratio": r.ratio,
                "ci": list(r.ci) if r.ci else None,
                "significant": r.significant,
                "quantile_switch": None
                if r.switched_from is None
                else {"from": r.switched_from, "to": r.quantile, "reason": r.switch_reason},
            },
            "metrics": [
                {
                    "name": e.name,
                    "quantile": e.quantile,
                    "baseline": e.baseline,
                    "candidate": e.candidate,
                    "ci": list(e.ci) if e.ci else None,
                }
                for e in self.estimates
                if e.quantile in REPORTED_QUANTILES
            ],
            "findings": [
                {
                    "rank": i + 1,
                    "cause": f.cause,
                    "title": f.title,
                    "score": f.score,
                    "confidence": f.confidence,
                    "stage": f.stage,
                    "scope": dict(f.scope),
                    "evidence": [e.to_dict() for e in f.evidence],
                    "next_check": f.next_check,
                }
                for i, f in enumerate(self.findings)
            ],
            "notes": list(self.notes),
            "errors": list(self.errors),
        }
        return dict(_num(out))

    def render(self, fmt: Literal["text", "json", "markdown"] = "text") -> str:
        """The report as terminal text, indented JSON or Markdown."""
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2)
        if fmt == "markdown":
            return self._markdown()
        if fmt == "text":
            return self._text()
        raise ValueError(f"unknown format {fmt!r}")

    def _headline(self) -> str:
        r = self.regression
        if r.metric in SHARE_HEADLINES:
            verdict = "REGRESSED" if r.significant else "no significant regression"
            what = "error rate" if r.metric == "error_rate" else "retried share"
            return f"{what}: {_fmt_any(r.baseline)} -> {_fmt_any(r.candidate)} — {verdict}"
        label = f"{r.metric} p{round(r.quantile * 100)}"
        ratio = f" ({r.ratio:.2f}x)" if r.ratio else ""
        ci = f", 95% CI of the change {_fmt_ci(r.ci)}" if r.ci else ""
        verdict = "REGRESSED" if r.significant else "no significant regression"
        return f"{label}: {_fmt_s(r.baseline)} -> {_fmt_s(r.candidate)}{ratio}{ci} — {verdict}"

    def _deploy_note(self) -> str | None:
        return next((n for n in self.notes if any(n.startswith(p) for p, _ in _DEPLOY_NOTES)), None)

    def comparison(self) -> str:
        """What was compared, in one line: the deploy by name where the resolution named one.

        ``before vs after the deploy of vllm v2 at 2026-01-15T09:03:00.001Z (deploy marker)``,
        ``service.version v1 (baseline) vs v2 (candidate)``, ``before vs after 2026-...Z``
        or ``two explicit windows``.
        """
        note = self._deploy_note()
        for prefix, template in _DEPLOY_NOTES:
            if note is not None and note.startswith(prefix):
                return template.format(note.removeprefix(prefix))
        versions = [(w.get("filter") or {}).get("service.version") for w in (self.baseline, self.candidate)]
        if all(versions):
            return f"service.version {versions[0]} (baseline) vs {versions[1]} (candidate)"
        mode = self.selection.mode if self.selection is not None else None
        if self.selection is not None and self.selection.deploy_at_ns is not None:
            # The windows may not meet at the deploy (a restart's dead time, a rollout left out).
            return f"before vs after {format_time(self.selection.deploy_at_ns)}"
        if mode != "windows" and self.baseline.get("end") and self.baseline.get("end") == self.candidate.get("start"):
            return f"before vs after {self.candidate['start']}"
        return "two explicit windows"

    def _switch(self) -> list[str]:
        """The line saying why the headline is below p99 (none when it is not)."""
        r = self.regression
        if r.switched_from is None:
            return []
        return [f"(p{round(r.quantile * 100)} instead of p{round(r.switched_from * 100)}: {r.switch_reason})"]

    def _windows(self, code: bool = False) -> list[str]:
        return [
            f"{side:9s} {w['start']} .. {w['end']}  {w['requests']} requests"
            + (f"  where {_fmt_filter(w['filter'], code)}" if w.get("filter") else "")
            for side, w in (("baseline", self.baseline), ("candidate", self.candidate))
        ]

    def _shown_notes(self) -> list[str]:
        """The notes, less the one the comparison line already says."""
        promoted = self._deploy_note()
        return [n for n in self.notes if n != promoted]

    def _metric_header(self) -> list[str]:
        head = ["metric", "baseline", "candidate", "change, 95% CI"]
        return head + (["regressed", "source"] if self.estimate_details else [])

    def _metric_rows(self) -> list[list[str]]:
        rows = []
        for e in self.estimates:
            if e.quantile not in REPORTED_QUANTILES:
                continue
            row = [f"{e.name} p{round(e.quantile * 100)}", _fmt_s(e.baseline), _fmt_s(e.candidate), _fmt_ci(e.ci)]
            if self.estimate_details:
                row += ["yes" if e.significant else "", e.source]
            rows.append(row)
        return rows

    def _text(self) -> str:
        lines = ["sre-agent diagnosis", "", f"compared: {self.comparison()}", *self._windows(), ""]
        lines += [self._headline(), *self._switch(), ""]
        header, rows = self._metric_header(), self._metric_rows()
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        # Names and words left-aligned, figures right-aligned.
        align = ["<", ">", ">", ">", "<", "<"]
        for row in [header, *rows]:
            lines.append("  ".join(f"{c:{align[i]}{widths[i]}}" for i, c in enumerate(row)).rstrip())
        if self.estimate_details:
            lines.append(REGRESSED_LEGEND)
        lines.append("")
        for i, f in enumerate(self.findings, 1):
            scope = " in " + _fmt_filter(f.scope) if f.scope else ""
            stage = f" [{f.stage}]" if f.stage else ""
            lines.append(f"{i}. {f.cause}{stage}{scope}  score {f.score:.2f} (confidence {f.confidence:.2f})")
            lines.append(f"   {f.title}")
            for e in f.evidence:
                detail = f" — {e.detail}" if e.detail else ""
                lines.append(f"   · {e.signal}: {_fmt_any(e.baseline)} -> {_fmt_any(e.candidate)}{detail}")
            if f.next_check:
                lines.append(f"   next: {f.next_check}")
        if not self.findings:
            lines.append("No rule explains the regression; check the metrics above and the notes.")
        lines.extend(f"note: {n}" for n in self._shown_notes())
        lines.extend(f"rule error: {e}" for e in self.errors)
        return "\n".join(lines) + "\n"

    def _markdown(self) -> str:
        lines = ["## Diagnosis", "", f"Compared: {self.comparison()}", ""]
        lines += [*(f"- {w}" for w in self._windows(code=True)), "", f"**{self._headline()}**"]
        lines += [*(f"\n{line}" for line in self._switch()), ""]
        header = self._metric_header()
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines.extend("| " + " | ".join(row) + " |" for row in self._metric_rows())
        if self.estimate_details:
            lines += ["", f"*{REGRESSED_LEGEND}.*"]
        lines += ["", "### Findings", ""]
        for i, f in enumerate(self.findings, 1):
            scope = " in " + _fmt_filter(f.scope, code=True) if f.scope else ""
            stage = f" (stage: {f.stage})" if f.stage else ""
            lines.append(f"{i}. **{f.cause}**{stage}{scope} — score {f.score:.2f}, confidence {f.confidence:.2f}")
            lines.append(f"   {f.title}")
            if f.evidence:
                lines.append("")
                lines.append("   | signal | baseline | candidate | detail |")
                lines.append("   |---|---|---|---|")
                lines.extend(
                    f"   | {e.signal} | {_fmt_any(e.baseline)} | {_fmt_any(e.candidate)} | {e.detail} |"
                    for e in f.evidence
                )
                lines.append("")
            if f.next_check:
                lines.append(f"   *Next check:* {f.next_check}")
            lines.append("")
        if not self.findings:
            lines.append("No rule explains the regression.")
        notes = self._shown_notes()
        if notes:
            lines += ["", "### Notes", "", *(f"- {n}" for n in notes)]
        if self.errors:
            lines += ["", "### Rule errors", "", *(f"- {e}" for e in self.errors)]
        return "\n".join(lines) + "\n"


def render_dict(data: dict[str, Any], fmt: Literal["text", "json", "markdown"] = "text") -> str:
    """Render a report received as JSON (the ``--url`` path of the CLI)."""
    return Report.from_dict(data).render(fmt)
