"""Fitted allocators survive JSON: saved by ``evaluate --save-policies``, loaded, and replayed identically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sre_agent.cli import main
from sre_agent.errors import PolicyError
from sre_agent.policy import load_allocators
from sre_agent.policy.evaluate import ArmHistory, Replay, evaluate_policies, load_tasks, parse_tasks, split_tasks
from sre_agent.policy.specs import from_spec, save_allocators, to_spec
from sre_agent.policy.tables import synthetic_tasks

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "compute" / "tot-game24"


@pytest.mark.parametrize("table", ["game24", "synthetic"])
def test_saved_policies_replay_exactly_like_the_fitted_ones(table: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    if table == "game24":
        assert main(["policy", "convert-game24", "--data", str(DATA), "--out", str(path)]) == 0
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_tasks(500, seed=2, feature_signal=0.8)))
    saved = tmp_path / "fitted.json"
    assert main(["policy", "evaluate", "--tasks", str(path), "--save-policies", str(saved), "--deadline", "600"]) == 0
    loaded = load_allocators(saved)
    tasks = load_tasks(path)
    fitted = evaluate_policies(tasks, deadline_s=600.0).fitted
    assert set(loaded) == set(fitted)
    kinds = {name: to_spec(policy)["kind"] for name, policy in loaded.items()}
    expected = {"router": "probe_router", "cascade": "cascade"} if table == "game24" else {"cascade": "cascade"}
    assert expected.items() <= kinds.items()
    if table == "synthetic":
        assert kinds["router"] == "feature_router"
    train, test = split_tasks(tasks, 0.5)
    replay = Replay(ArmHistory.from_tasks(train), 600.0, None)
    for name, policy in fitted.items():
        assert to_spec(loaded[name]) == to_spec(policy)
        assert replay.runs(loaded[name], test) == replay.runs(policy, test)


def test_malformed_specs_are_one_readable_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="unknown allocator kind"):
        from_spec({"kind": "oracle"})
    with pytest.raises(PolicyError, match="malformed allocator spec"):
        from_spec({"kind": "cascade", "stages": [{"kind": "single"}]})
    with pytest.raises(PolicyError, match="one route more than cuts"):
        from_spec({"kind": "feature_router", "cuts": [0.5], "routes": [{"kind": "give_up"}],
                   "model": {"names": [], "mean": [], "scale": [], "weights": [], "intercept": 0.0}})  # fmt: skip
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something-else", "policies": {}}')
    with pytest.raises(PolicyError, match="is not an sre-agent/policy-allocators/v1 document"):
        load_allocators(bad)
    tasks = parse_tasks([json.dumps(r) for r in synthetic_tasks(50, seed=1)])
    with pytest.raises(PolicyError, match="cannot write"):
        save_allocators(evaluate_policies(tasks).fitted, tmp_path / "missing-dir" / "x.json")
