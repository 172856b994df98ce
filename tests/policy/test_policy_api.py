"""The policy package's public names, and that a gateway importing it pays for no store or TUI."""

from __future__ import annotations

import json
import subprocess
import sys

import sre_agent
from sre_agent import policy


def test_policy_all_is_sorted_complete_and_resolvable() -> None:
    assert policy.__all__ == sorted(policy.__all__)
    assert set(policy.__all__) == set(policy._LAZY)
    for name in policy.__all__:
        assert getattr(policy, name) is not None, name
    assert sre_agent.PolicyEngine is policy.PolicyEngine
    assert sre_agent.RetryBudget is policy.RetryBudget


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_classification_imports_neither_httpx_nor_the_store() -> None:
    loaded = _loaded_after("from sre_agent.policy import classify, Budget, RetryBudget")
    assert not loaded & {"httpx", "duckdb", "polars", "textual", "opentelemetry.trace"}


def test_the_engine_imports_no_store_or_tui() -> None:
    loaded = _loaded_after("from sre_agent.policy import PolicyEngine, evaluate_policies, Router")
    assert "httpx" in loaded
    assert "tenacity" in loaded
    assert not loaded & {"duckdb", "polars", "pyarrow", "textual"}
