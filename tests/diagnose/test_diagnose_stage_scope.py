"""The stage decomposition's finding takes the slice a mechanism rule found for the same cause and stage."""

from __future__ import annotations

from sre_agent.analysis.diagnosis import _STAGE_RULE, _stage_scopes
from sre_agent.analysis.rules_api import Finding
from sre_agent.analysis.rules_registry import list_rules


def _finding(rule: str, cause: str, stage: str, confidence: float, scope: dict[str, str] | None = None) -> Finding:
    return Finding(
        cause=cause, title=f"{rule} says {cause}", explained=1.0, confidence=confidence, stage=stage,
        scope=scope or {},
    ).with_rule(rule)  # fmt: skip


def test_stage_finding_inherits_the_scope_of_the_same_mechanism() -> None:
    # A guardrail slowed for one tenant: the decomposition ranks first (dependency time, all
    # requests), the dependency rule second with the tenant. The top finding must name the tenant.
    stage = _finding(_STAGE_RULE, "dependency", "dependency", 0.25)
    rule = _finding("dependency", "dependency", "dependency", 0.01, {"tenant.id": "stark"})
    out = _stage_scopes([stage, rule])
    assert out[0].rule == _STAGE_RULE
    assert out[0].scope == {"tenant.id": "stark"}
    assert out[0].score == stage.score
    assert out[1] == rule


def test_other_causes_or_stages_lend_no_scope() -> None:
    stage = _finding(_STAGE_RULE, "dependency", "dependency", 0.25)
    other_cause = _finding("traffic_mix", "traffic_mix", "dependency", 0.5, {"tenant.id": "acme"})
    other_stage = _finding("dependency", "dependency", "gateway", 0.5, {"tenant.id": "acme"})
    out = _stage_scopes([stage, other_cause, other_stage])
    assert out[0].scope == {}


def test_a_scope_of_its_own_is_kept() -> None:
    stage = _finding(_STAGE_RULE, "dependency", "dependency", 0.25, {"host.name": "replica-2"})
    rule = _finding("dependency", "dependency", "dependency", 0.1, {"tenant.id": "stark"})
    assert _stage_scopes([stage, rule])[0].scope == {"host.name": "replica-2"}


def test_the_stage_rule_name_is_a_registered_rule() -> None:
    # The inheritance keys on the rule's entry-point name; a rename must not silently disable it.
    assert _STAGE_RULE in {rule.name for rule in list_rules()}
