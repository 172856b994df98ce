"""The ranked diagnosis: a tree of findings, and its Markdown for the incident doc.

The report is the CONTRACTS section 3 JSON (``sre-agent/diagnosis/v1``),
whether it came from the local diagnose engine or ``POST /api/v1/diagnose``,
so one renderer serves both modes.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Tree

from sre_agent.tui.widgets import fmt_s

__all__ = ["FindingsTree", "finding_markdown", "finding_title", "regression_line", "report_markdown"]


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "–" if value is None else str(value)


def finding_title(finding: dict[str, Any]) -> str:
    """``#1 prefix_cache 0.82 · title`` (score is the share of the regression explained, as reported)."""
    rank, cause, score = finding.get("rank", "?"), finding.get("cause", "?"), _value(finding.get("score"))
    return f"#{rank} {cause} {score} · {finding.get('title', '')}"


def regression_line(report: dict[str, Any]) -> str:
    """``e2e p99 7.25s→16.7s ×2.30 (CI 2.1–2.5), significant``; empty when the report has none."""
    reg = report.get("regression") or {}
    if not reg:
        return ""
    ci = reg.get("ci") or []
    ci_text = f" (CI {_value(ci[0])}–{_value(ci[1])})" if len(ci) == 2 else ""
    quantile = reg.get("quantile")
    q = f"p{round(quantile * 100)}" if isinstance(quantile, int | float) else ""
    verdict = "significant" if reg.get("significant") else "not significant"
    return (
        f"{reg.get('metric', '?')} {q} {fmt_s(reg.get('baseline'))}→{fmt_s(reg.get('candidate'))} "
        f"×{_value(reg.get('ratio'))}{ci_text}, {verdict}"
    )


def _scope_text(finding: dict[str, Any]) -> str:
    scope = finding.get("scope") or {}
    return ", ".join(f"{k}={v}" for k, v in scope.items()) or "all traffic"


def finding_markdown(finding: dict[str, Any]) -> str:
    """One finding as a Markdown section: headline, facts, evidence table, next check."""
    lines = [
        f"### {finding_title(finding)}",
        "",
        f"- cause: `{finding.get('cause')}`; stage: {finding.get('stage') or '–'}; scope: {_scope_text(finding)}",
        f"- score: {_value(finding.get('score'))}; confidence: {_value(finding.get('confidence'))}",
    ]
    evidence = finding.get("evidence") or []
    if evidence:
        lines += ["", "| signal | baseline | candidate | detail |", "|---|---|---|---|"]
        for ev in evidence:
            cells = [str(ev.get("signal", "")), _value(ev.get("baseline")), _value(ev.get("candidate"))]
            cells.append(str(ev.get("detail", "")))
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if finding.get("next_check"):
        lines += ["", f"**Next check:** {finding['next_check']}"]
    return "\n".join(lines) + "\n"


def report_markdown(report: dict[str, Any], comparison: str = "") -> str:
    """The whole diagnosis as Markdown for the incident doc."""
    head = ["## sre-agent diagnosis", ""]
    if comparison:
        head.append(f"Comparison: {comparison}")
    for side in ("baseline", "candidate"):
        info = report.get(side) or {}
        if info:
            head.append(f"- {side}: {info.get('start')} .. {info.get('end')}, {info.get('requests')} requests")
    line = regression_line(report)
    if line:
        head.append(f"- regression: {line}")
    sections = [finding_markdown(f) for f in report.get("findings") or []] or ["No rule explains the regression.\n"]
    return "\n".join(head) + "\n\n" + "\n".join(sections)


class FindingsTree(Tree[dict[str, Any]]):
    """Findings as expandable nodes: enter shows the evidence and the next check."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("findings", **kwargs)
        self.show_root = False

    def show_report(self, report: dict[str, Any]) -> None:
        """Replace the tree with the report's findings, the first one expanded."""
        self.clear()
        for i, finding in enumerate(report.get("findings") or []):
            node = self.root.add(Text(finding_title(finding), style="bold" if i == 0 else ""), data=finding)
            node.add_leaf(f"stage {finding.get('stage') or '–'} · scope {_scope_text(finding)}", data=finding)
            node.add_leaf(f"confidence {_value(finding.get('confidence'))}", data=finding)
            for ev in finding.get("evidence") or []:
                node.add_leaf(
                    f"{ev.get('signal')}: {_value(ev.get('baseline'))} → {_value(ev.get('candidate'))}"
                    + (f"  {ev.get('detail')}" if ev.get("detail") else ""),
                    data=finding,
                )
            if finding.get("next_check"):
                node.add_leaf(Text(f"next: {finding['next_check']}", style="italic"), data=finding)
            if i == 0:
                node.expand()
        self.root.expand()

    @property
    def selected_finding(self) -> dict[str, Any] | None:
        """The finding under the cursor (any of its lines), or ``None``."""
        node = self.cursor_node
        return node.data if node is not None else None
