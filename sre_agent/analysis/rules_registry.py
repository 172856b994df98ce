"""The ordered registry of diagnosis rules, fed by one entry-point group.

Built-in rules register exactly like third-party ones, under the group
``sre_agent.rules`` (see ``pyproject.toml``). Listing names reads package
metadata only and imports nothing; loading imports each rule on its own, and
a rule that fails to import is reported and skipped, never fatal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from sre_agent.analysis.rules_api import Rule

__all__ = ["GROUP", "LoadFailure", "RuleInfo", "list_rules", "load_rules"]

GROUP = "sre_agent.rules"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuleInfo:
    """A registered rule, known without importing it.

    Attributes:
        name: the entry-point name (also the rule's function name).
        target: ``module:function``.
        distribution: the installed package that registered it (``None`` if unknown).
    """

    name: str
    target: str
    distribution: str | None


@dataclass(frozen=True)
class LoadFailure:
    """A rule that could not be loaded or run, and why."""

    name: str
    error: str


def _entry_points() -> list[EntryPoint]:
    seen: set[str] = set()
    out: list[EntryPoint] = []
    for ep in entry_points(group=GROUP):
        if ep.name not in seen:  # the first registration of a name wins
            seen.add(ep.name)
            out.append(ep)
    return out


def list_rules() -> list[RuleInfo]:
    """Every registered rule in registry order (metadata only; nothing is imported)."""
    return [RuleInfo(ep.name, ep.value, ep.dist.name if ep.dist else None) for ep in _entry_points()]


def load_rules(names: list[str] | None = None) -> tuple[list[tuple[str, Rule]], list[LoadFailure]]:
    """Import rules (all, or those in ``names``, in registry order).

    Returns the loaded ``(name, rule)`` pairs and the failures; an unknown
    name in ``names`` is a failure too.
    """
    eps = _entry_points()
    wanted = set(names) if names is not None else None
    loaded: list[tuple[str, Rule]] = []
    failures: list[LoadFailure] = []
    for ep in eps:
        if wanted is not None and ep.name not in wanted:
            continue
        try:
            rule = ep.load()
        except Exception as exc:  # a broken plugin must not take diagnosis down
            _log.warning("rule %s failed to load: %s", ep.name, exc)
            failures.append(LoadFailure(ep.name, f"failed to load: {type(exc).__name__}: {exc}"))
            continue
        if not callable(rule):
            failures.append(LoadFailure(ep.name, f"{ep.value} is not callable"))
            continue
        loaded.append((ep.name, rule))
    if wanted is not None:
        known = {ep.name for ep in eps}
        failures.extend(LoadFailure(n, "no such rule is installed") for n in sorted(wanted - known))
    return loaded, failures
