"""sre-agent: incident diagnosis, canary gating and bounded retries for LLM serving.

The public API is the sorted ``__all__`` below. Names resolve lazily so that
``import sre_agent`` stays fast and pulls in neither DuckDB, polars nor
Textual until a name that needs them is used (``sre_agent.policy`` in a
gateway must not pay for the store).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "BadPayloadError": "sre_agent.errors",
    "CAUSES": "sre_agent.analysis.rules_api",
    "CanarySpec": "sre_agent.canary.spec",
    "Comparison": "sre_agent.analysis.compare",
    "Config": "sre_agent.config",
    "ConfigError": "sre_agent.errors",
    "Deploy": "sre_agent.store.embedded",
    "Evidence": "sre_agent.analysis.rules_api",
    "FileResult": "sre_agent.ingest.files",
    "Finding": "sre_agent.analysis.rules_api",
    "IngestError": "sre_agent.errors",
    "InsufficientDataError": "sre_agent.errors",
    "Normaliser": "sre_agent.ingest.normalise",
    "OverloadedError": "sre_agent.errors",
    "PayloadTooLargeError": "sre_agent.errors",
    "PolicyEngine": "sre_agent.policy.client",
    "PolicyError": "sre_agent.errors",
    "RemoteError": "sre_agent.errors",
    "Report": "sre_agent.analysis.report",
    "RetryBudget": "sre_agent.policy.budget",
    "ScenarioError": "sre_agent.errors",
    "Selection": "sre_agent.analysis.selection",
    "SelectionError": "sre_agent.errors",
    "SreAgentError": "sre_agent.errors",
    "Store": "sre_agent.store.embedded",
    "StoreError": "sre_agent.errors",
    "StoreLockedError": "sre_agent.errors",
    "StoreMetricExporter": "sre_agent.ingest.exporter",
    "StoreSpanExporter": "sre_agent.ingest.exporter",
    "UsageError": "sre_agent.errors",
    "Window": "sre_agent.analysis.selection",
    "diagnose": "sre_agent.analysis.diagnosis",
    "ingest_files": "sre_agent.ingest.files",
    "load_config": "sre_agent.config",
}

__all__ = [
    "BadPayloadError",
    "CAUSES",
    "CanarySpec",
    "Comparison",
    "Config",
    "ConfigError",
    "Deploy",
    "Evidence",
    "FileResult",
    "Finding",
    "IngestError",
    "InsufficientDataError",
    "Normaliser",
    "OverloadedError",
    "PayloadTooLargeError",
    "PolicyEngine",
    "PolicyError",
    "RemoteError",
    "Report",
    "RetryBudget",
    "ScenarioError",
    "Selection",
    "SelectionError",
    "SreAgentError",
    "Store",
    "StoreError",
    "StoreLockedError",
    "StoreMetricExporter",
    "StoreSpanExporter",
    "UsageError",
    "Window",
    "__version__",
    "diagnose",
    "ingest_files",
    "load_config",
]

if TYPE_CHECKING:
    from sre_agent.analysis.compare import Comparison
    from sre_agent.analysis.diagnosis import diagnose
    from sre_agent.analysis.report import Report
    from sre_agent.analysis.rules_api import CAUSES, Evidence, Finding
    from sre_agent.analysis.selection import Selection, Window
    from sre_agent.canary.spec import CanarySpec
    from sre_agent.config import Config, load_config
    from sre_agent.errors import (
        BadPayloadError,
        ConfigError,
        IngestError,
        InsufficientDataError,
        OverloadedError,
        PayloadTooLargeError,
        PolicyError,
        RemoteError,
        ScenarioError,
        SelectionError,
        SreAgentError,
        StoreError,
        StoreLockedError,
        UsageError,
    )
    from sre_agent.ingest.exporter import StoreMetricExporter, StoreSpanExporter
    from sre_agent.ingest.files import FileResult, ingest_files
    from sre_agent.ingest.normalise import Normaliser
    from sre_agent.policy.budget import RetryBudget
    from sre_agent.policy.client import PolicyEngine
    from sre_agent.store.embedded import Deploy, Store


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sre_agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
