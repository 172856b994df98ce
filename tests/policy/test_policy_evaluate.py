"""Game-of-24 conversion and checker, offline evaluation (CONTRACTS 6) and the CLI, on the real logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sre_agent.cli import main
from sre_agent.policy.evaluate import SCHEMA, DecodeModel, evaluate_policies, parse_tasks, split_tasks
from sre_agent.policy.game24 import check_answer, convert_tot_logs, write_jsonl

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "compute" / "tot-game24"
POLICY_KEYS = {
    "name",
    "kind",
    "success_rate",
    "spend_per_success_usd",
    "total_spend_usd",
    "mean_latency_s",
    "p99_latency_s",
    "deadline_miss_rate",
    "verifier_spend_usd",
}


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("game24") / "game24.jsonl"
    assert main(["policy", "convert-game24", "--data", str(DATA), "--out", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def report(table: Path) -> dict[str, Any]:
    tasks = parse_tasks(table.read_text().splitlines())
    return evaluate_policies(tasks, deadline_s=600.0, train_fraction=0.5).report


@pytest.mark.parametrize(
    ("puzzle", "output", "ok"),
    [
        ("4 4 6 8", "Answer: (4 + 8) * (6 - 4) = 24", True),
        ("3 3 8 8", "steps...\nAnswer: 8 / (3 - 8 / 3) = 24", True),
        ("4 4 6 8", "Answer: (4 + 8) * (6 - 4) + 0 = 24", False),
        ("4 4 6 8", "Answer: 4 * 6 * (8 - 4) = 24", False),
        ("1 1 1 1", "Answer: 1 / (1 - 1) + 1 = 24", False),
        ("4 5 6 10", "Answer: None", False),
        ("4 5 6 10", "Answer: __import__('os') = 24", False),
    ],
)
def test_checker(puzzle: str, output: str, ok: bool) -> None:
    assert check_answer(puzzle, output) is ok


def test_conversion_matches_the_logs() -> None:
    tasks = convert_tot_logs(DATA)  # raises if the checker disagrees with any logged label
    assert len(tasks) == 100
    coverage = {arm: sum(any(s["correct"] for s in t["arms"][arm]) for t in tasks) / 100 for arm in tasks[0]["arms"]}
    assert coverage == {"standard": 0.33, "cot": 0.49, "tot": 0.62, "tot_checked": 0.69}
    raw = json.loads((DATA / "gpt-4_0.7_naive_standard_sample_100_start900_end1000.json").read_text())
    logged = raw[-1]["usage_so_far"]["completion_tokens"]
    assert sum(s["output_tokens"] for t in tasks for s in t["arms"]["standard"]) == logged
    tot = json.loads((DATA / "gpt-4_0.7_propose1_value3_greedy5_start900_end1000.json").read_text())
    assert sum(t["arms"]["tot"][0]["cost_usd"] for t in tasks) == pytest.approx(tot[-1]["usage_so_far"]["cost"])


def test_report_follows_contract_6(report: dict[str, Any]) -> None:
    assert report["schema"] == SCHEMA
    assert report["tasks"] == {"train": 50, "test": 50}
    assert report["deadline_s"] == 600.0
    assert report["budget_usd"] is None
    names = {p["name"] for p in report["policies"]}
    assert {"single:standard", "single:cot", "single:tot", "single:tot_checked"} <= names
    for policy in report["policies"]:
        # CONTRACTS 6 is additive-only: every contract key, plus ``fit`` on adaptive entries.
        assert set(policy) == POLICY_KEYS | ({"fit"} if policy["kind"] == "adaptive" else set())
        assert policy["kind"] in ("fixed", "adaptive")
        assert 0.0 <= policy["success_rate"] <= 1.0
        assert 0.0 <= policy["deadline_miss_rate"] <= 1.0
        assert policy["p99_latency_s"] <= 600.0
        assert policy["mean_latency_s"] <= policy["p99_latency_s"]


def test_an_adaptive_policy_beats_the_best_fixed_one_on_held_out_tasks(report: dict[str, Any]) -> None:
    fixed = [p for p in report["policies"] if p["kind"] == "fixed"]
    best = max(fixed, key=lambda p: (p["success_rate"], -p["deadline_miss_rate"]))
    winners = [
        p
        for p in report["policies"]
        if p["kind"] == "adaptive"
        and p["success_rate"] >= best["success_rate"]
        and p["deadline_miss_rate"] <= best["deadline_miss_rate"]
        and p["spend_per_success_usd"] < best["spend_per_success_usd"]
    ]
    assert winners, f"no adaptive policy beats {best}"


def test_fitting_never_sees_test_labels() -> None:
    lines: list[dict[str, Any]] = []
    for t in range(40):
        arms: dict[str, list[dict[str, Any]]] = {
            "cheap": [
                {
                    "correct": (t + i) % 7 == 0,
                    "input_tokens": 10,
                    "output_tokens": 5,
                    "cost_usd": 0.01,
                    "answer": str(i % 3),
                }
                for i in range(20)
            ],
            "strong": [{"correct": t % 3 != 0, "input_tokens": 100, "output_tokens": 500, "cost_usd": 0.5}],
        }
        lines.append(
            {
                "task_id": f"t{t}",
                "arms": arms,
                "verifier": {
                    "cost_usd": 0.001,
                    "latency_s": 0.1,
                    "true_positive_rate": 0.9,
                    "false_positive_rate": 0.05,
                },
            }
        )
    tasks = parse_tasks([json.dumps(line) for line in lines])
    first = evaluate_policies(tasks, deadline_s=120.0)
    flipped_lines = []
    _, test = split_tasks(tasks, 0.5)
    test_ids = {t.task_id for t in test}
    for line in lines:
        if line["task_id"] in test_ids:
            for samples in line["arms"].values():
                for s in samples:
                    s["correct"] = not s["correct"]
        flipped_lines.append(json.dumps(line))
    second = evaluate_policies(parse_tasks(flipped_lines), deadline_s=120.0)
    assert first.notes == second.notes  # same fitted policies
    assert first.report != second.report  # but the test figures moved
    verifier = [p["verifier_spend_usd"] for p in first.report["policies"] if p["name"].startswith("best_of")]
    assert verifier
    assert all(v > 0 for v in verifier)


def test_decode_model_fills_missing_latency() -> None:
    row = {
        "task_id": "x",
        "arms": {"a": [{"correct": True, "input_tokens": 2000, "output_tokens": 200, "cost_usd": 0.1, "calls": 3}]},
    }
    (task,) = parse_tasks([json.dumps(row)], DecodeModel(ttft_s=0.5, prefill_tokens_per_s=1000, decode_tokens_per_s=50))
    assert task.arms["a"][0].latency_s == pytest.approx(3 * 0.5 + 2.0 + 4.0)


def test_cli_json_and_usage_errors(table: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    small = tmp_path / "small.jsonl"
    write_jsonl([json.loads(line) for line in table.read_text().splitlines()[:16]], small)
    assert main(["policy", "evaluate", "--tasks", str(small), "--format", "json", "--budget-usd", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == SCHEMA
    assert out["budget_usd"] == 2.0
    assert all(p["total_spend_usd"] <= 2.0 * out["tasks"]["test"] + 1e-9 for p in out["policies"])
    assert main(["policy", "evaluate", "--tasks", str(small), "--train-fraction", "1.5"]) == 1
    assert main(["policy", "evaluate", "--tasks", str(tmp_path / "missing.jsonl")]) == 1
    assert main(["policy", "evaluate", "--tasks", str(small), "--deadline", "-1"]) == 2
    assert "--deadline must be positive" in capsys.readouterr().err
