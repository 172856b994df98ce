"""Bounded retries and compute allocation for reasoning-model requests.

Gateway middleware imports this package; it never touches the store (no duckdb,
polars or textual, checked by import-linter). Names resolve lazily so that
``from sre_agent.policy import classify`` does not import httpx or OpenTelemetry.

- :func:`classify` / :class:`Outcome` / :class:`OutcomeClass`: why an attempt gave no usable answer.
- :class:`Budget` / :class:`BudgetLimits`: per-request attempts, tokens, dollars, deadline.
- :class:`RetryBudget`: the process-wide (Finagle-style) retry budget.
- :class:`PolicyEngine`, :func:`run_request`, :func:`arun_request`: the httpx entry points.
- :class:`ToolLedger`: side-effecting tool calls run at most once.
- :mod:`~sre_agent.policy.allocate`: compute-allocation strategies and the router;
  :class:`LiveSource` runs them on live engines.
- :func:`evaluate_policies`: offline evaluation over task-outcome tables (CONTRACTS 6), including
  single-outcome tables (verifier cascades, :class:`FeatureRouter`); :func:`load_allocators`
  reads the policies it fitted (``--save-policies``) for a gateway to run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY: dict[str, str] = {
    "AdaptiveSampling": "sre_agent.policy.allocate",
    "AgreementCascade": "sre_agent.policy.allocate",
    "AttemptRecord": "sre_agent.policy.client",
    "AttemptState": "sre_agent.policy.strategies",
    "BestOfN": "sre_agent.policy.allocate",
    "Budget": "sre_agent.policy.budget",
    "BudgetLimits": "sre_agent.policy.budget",
    "ChatRequest": "sre_agent.policy.recovery",
    "Cascade": "sre_agent.policy.allocate",
    "DecodeModel": "sre_agent.policy.evaluate",
    "FeatureRouter": "sre_agent.policy.routing",
    "LiveSource": "sre_agent.policy.live",
    "Outcome": "sre_agent.policy.outcome",
    "OutcomeClass": "sre_agent.policy.outcome",
    "PolicyEngine": "sre_agent.policy.client",
    "PolicyResult": "sre_agent.policy.client",
    "Pricing": "sre_agent.policy.outcome",
    "RecoveryConfig": "sre_agent.policy.recovery",
    "RetryBudget": "sre_agent.policy.budget",
    "Router": "sre_agent.policy.allocate",
    "SingleRun": "sre_agent.policy.allocate",
    "Target": "sre_agent.policy.recovery",
    "ToolLedger": "sre_agent.policy.ledger",
    "Usage": "sre_agent.policy.outcome",
    "arun_request": "sre_agent.policy.client",
    "classify": "sre_agent.policy.outcome",
    "evaluate_policies": "sre_agent.policy.evaluate",
    "load_allocators": "sre_agent.policy.specs",
    "retry_if_recoverable": "sre_agent.policy.strategies",
    "run_request": "sre_agent.policy.client",
    "stop_on_budget": "sre_agent.policy.strategies",
    "stop_on_fleet_budget": "sre_agent.policy.strategies",
    "wait_full_jitter": "sre_agent.policy.strategies",
    "wait_server_hint": "sre_agent.policy.strategies",
}

__all__ = [
    "AdaptiveSampling",
    "AgreementCascade",
    "AttemptRecord",
    "AttemptState",
    "BestOfN",
    "Budget",
    "BudgetLimits",
    "Cascade",
    "ChatRequest",
    "DecodeModel",
    "FeatureRouter",
    "LiveSource",
    "Outcome",
    "OutcomeClass",
    "PolicyEngine",
    "PolicyResult",
    "Pricing",
    "RecoveryConfig",
    "RetryBudget",
    "Router",
    "SingleRun",
    "Target",
    "ToolLedger",
    "Usage",
    "arun_request",
    "classify",
    "evaluate_policies",
    "load_allocators",
    "retry_if_recoverable",
    "run_request",
    "stop_on_budget",
    "stop_on_fleet_budget",
    "wait_full_jitter",
    "wait_server_hint",
]

if TYPE_CHECKING:
    from sre_agent.policy.allocate import AdaptiveSampling, AgreementCascade, BestOfN, Cascade, Router, SingleRun
    from sre_agent.policy.budget import Budget, BudgetLimits, RetryBudget
    from sre_agent.policy.client import AttemptRecord, PolicyEngine, PolicyResult, arun_request, run_request
    from sre_agent.policy.evaluate import DecodeModel, evaluate_policies
    from sre_agent.policy.ledger import ToolLedger
    from sre_agent.policy.live import LiveSource
    from sre_agent.policy.outcome import Outcome, OutcomeClass, Pricing, Usage, classify
    from sre_agent.policy.recovery import ChatRequest, RecoveryConfig, Target
    from sre_agent.policy.routing import FeatureRouter
    from sre_agent.policy.specs import load_allocators
    from sre_agent.policy.strategies import (
        AttemptState,
        retry_if_recoverable,
        stop_on_budget,
        stop_on_fleet_budget,
        wait_full_jitter,
        wait_server_hint,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sre_agent.policy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
