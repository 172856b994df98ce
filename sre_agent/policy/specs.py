"""Allocators as JSON: fitted offline, saved, loaded by a gateway and run on live engines.

``sre-agent policy evaluate --save-policies FILE`` writes every fitted adaptive policy
in this form (``schema: "sre-agent/policy-allocators/v1"``); :func:`load_allocators`
reads it back into the same objects, which :meth:`sre_agent.policy.live.LiveSource.run`
runs with the gateway's deadline and dollar budget. Arm names are the table's; the
gateway maps each to an engine and request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sre_agent.errors import PolicyError
from sre_agent.policy.allocate import (
    AdaptiveSampling,
    AgreementCascade,
    Allocator,
    BestOfN,
    Cascade,
    DeadlineFallback,
    GiveUp,
    Router,
    SingleRun,
)
from sre_agent.policy.routing import FeatureRouter, SolvabilityModel

__all__ = ["SCHEMA", "from_spec", "load_allocators", "save_allocators", "to_spec"]

SCHEMA = "sre-agent/policy-allocators/v1"


def to_spec(policy: Allocator) -> dict[str, Any]:
    """A JSON-ready description of ``policy`` (raises :class:`PolicyError` for a kind it cannot describe)."""
    if isinstance(policy, SingleRun):
        return {"kind": "single", "arm": policy.arm, "verify": policy.verify}
    if isinstance(policy, BestOfN):
        return {"kind": "best_of", "arm": policy.arm, "n": policy.n}
    if isinstance(policy, AdaptiveSampling):
        return {
            "kind": "adaptive",
            "arm": policy.arm,
            "max_n": policy.max_n,
            "window": policy.window,
            "agree_share": policy.agree_share,
        }
    if isinstance(policy, Cascade):
        return {"kind": "cascade", "stages": [to_spec(stage) for stage in policy.stages]}
    if isinstance(policy, AgreementCascade):
        return {"kind": "agreement_cascade", "arms": list(policy.arms)}
    if isinstance(policy, DeadlineFallback):
        return {"kind": "deadline_fallback", "primary": to_spec(policy.primary), "fallback": to_spec(policy.fallback)}
    if isinstance(policy, GiveUp):
        return {"kind": "give_up"}
    if isinstance(policy, Router):
        return {
            "kind": "probe_router",
            "probe": to_spec(policy.probe),
            "routes": {name: to_spec(route) for name, route in sorted(policy.routes.items())},
            "default": to_spec(policy.default),
        }
    if isinstance(policy, FeatureRouter):
        return {
            "kind": "feature_router",
            "model": policy.model.to_dict(),
            "cuts": list(policy.cuts),
            "routes": [to_spec(route) for route in policy.routes],
        }
    raise PolicyError(f"cannot describe allocator {policy.name!r} as JSON")


def from_spec(spec: Mapping[str, Any]) -> Allocator:
    """The allocator ``spec`` describes (see :func:`to_spec`); :class:`PolicyError` on a malformed one."""
    try:
        kind = spec["kind"]
        if kind == "single":
            return SingleRun(str(spec["arm"]), verify=bool(spec.get("verify", False)))
        if kind == "best_of":
            return BestOfN(str(spec["arm"]), int(spec["n"]))
        if kind == "adaptive":
            share = None if spec.get("agree_share") is None else float(spec["agree_share"])
            return AdaptiveSampling(str(spec["arm"]), int(spec["max_n"]), int(spec.get("window", 1)), share)
        if kind == "cascade":
            return Cascade(tuple(from_spec(stage) for stage in spec["stages"]))
        if kind == "agreement_cascade":
            return AgreementCascade(tuple(str(arm) for arm in spec["arms"]))
        if kind == "deadline_fallback":
            return DeadlineFallback(from_spec(spec["primary"]), from_spec(spec["fallback"]))
        if kind == "give_up":
            return GiveUp()
        if kind == "probe_router":
            routes = {str(name): from_spec(route) for name, route in spec["routes"].items()}
            return Router(from_spec(spec["probe"]), routes=routes, default=from_spec(spec["default"]))
        if kind == "feature_router":
            m = spec["model"]
            model = SolvabilityModel(
                tuple(str(n) for n in m["names"]),
                tuple(float(v) for v in m["mean"]),
                tuple(float(v) for v in m["scale"]),
                tuple(float(v) for v in m["weights"]),
                float(m["intercept"]),
            )
            routes_list = tuple(from_spec(route) for route in spec["routes"])
            cuts = tuple(float(c) for c in spec["cuts"])
            if len(routes_list) != len(cuts) + 1 or len(set(map(len, (model.names, model.weights)))) != 1:
                raise ValueError("a feature router needs one route more than cuts and one weight per feature")
            return FeatureRouter(model, cuts, routes_list)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PolicyError(f"malformed allocator spec {dict(spec)!r:.200}: {exc!r}") from exc
    raise PolicyError(f"unknown allocator kind {kind!r}")


def save_allocators(policies: Mapping[str, Allocator], path: str | Path) -> None:
    """Write ``policies`` (report name -> allocator) as ``sre-agent/policy-allocators/v1`` JSON."""
    document = {"schema": SCHEMA, "policies": {name: to_spec(p) for name, p in policies.items()}}
    try:
        Path(path).write_text(json.dumps(document, indent=2) + "\n")
    except OSError as exc:
        raise PolicyError(f"cannot write {path}: {exc}") from exc


def load_allocators(path: str | Path) -> dict[str, Allocator]:
    """The allocators saved by :func:`save_allocators`, by report name."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PolicyError(f"cannot read allocators from {path}: {exc}") from exc
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise PolicyError(f"{path} is not an {SCHEMA} document")
    return {str(name): from_spec(spec) for name, spec in document["policies"].items()}
