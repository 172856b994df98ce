"""Single-outcome task tables: the latent-difficulty generator, the collapser, cascades and feature routing.

The "Must show" of issue 17 is checked on the test part of the split: an adaptive policy
reaches the best fixed policy's success (within 0.01) at no more than 0.6x its spend per
success, with deadline misses no worse, on synthetic tables whose arms are 50x apart in
price; and on the Game-of-24 logs collapsed to one outcome per arm it still beats the best
fixed policy (there it saves about 10 %, not 40 %: see docs/policy-allocation.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sre_agent.cli import main
from sre_agent.policy.evaluate import Evaluation, evaluate_policies, parse_tasks, split_tasks
from sre_agent.policy.game24 import convert_tot_logs
from sre_agent.policy.routing import FeatureRouter, fit_solvability
from sre_agent.policy.specs import load_allocators, save_allocators
from sre_agent.policy.tables import DEFAULT_ARMS, collapse_to_single, synthetic_tasks

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "compute" / "tot-game24"
DEADLINE_S = 120.0


def _evaluate(rows: list[dict[str, Any]], deadline_s: float | None = DEADLINE_S) -> Evaluation:
    return evaluate_policies(parse_tasks([json.dumps(r) for r in rows]), deadline_s=deadline_s)


def _best_fixed(report: dict[str, Any]) -> dict[str, Any]:
    """The fixed policy with the highest test success (fewest misses, then lowest spend, on ties)."""
    fixed = [p for p in report["policies"] if p["kind"] == "fixed"]
    return max(fixed, key=lambda p: (p["success_rate"], -p["deadline_miss_rate"], -p["spend_per_success_usd"]))


def _adaptive(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["policies"] if p["name"] == name)


@pytest.fixture(scope="module")
def game24_single() -> list[dict[str, Any]]:
    return collapse_to_single(convert_tot_logs(DATA))


def test_the_generator_is_seeded_and_its_arms_are_correlated_through_difficulty() -> None:
    rows = synthetic_tasks(4000, seed=3)
    assert rows == synthetic_tasks(4000, seed=3)
    assert rows != synthetic_tasks(4000, seed=4)
    for spec in DEFAULT_ARMS:
        rate = sum(r["arms"][spec.name][0]["correct"] for r in rows) / len(rows)
        assert rate == pytest.approx(spec.success_rate, abs=0.03)
        assert all(len(r["arms"][spec.name]) == 1 for r in rows)
    prices = {spec.name: spec.cost_usd for spec in DEFAULT_ARMS}
    assert prices["large"] == pytest.approx(50 * prices["small"])

    def ok(row: dict[str, Any], arm: str) -> bool:
        return bool(row["arms"][arm][0]["correct"])

    solved_by_small = [r for r in rows if ok(r, "small")]
    missed_by_small = [r for r in rows if not ok(r, "small")]
    strong_given_small = sum(ok(r, "large_best_of_100") for r in solved_by_small) / len(solved_by_small)
    strong_given_not = sum(ok(r, "large_best_of_100") for r in missed_by_small) / len(missed_by_small)
    assert strong_given_small > strong_given_not + 0.3  # a shared latent difficulty, as in real logs
    assert strong_given_small < 0.97  # ... but not nested: the strong arm still misses some easy ones
    easy = [r["difficulty"] for r in rows if all(ok(r, a.name) for a in DEFAULT_ARMS)]
    hard = [r["difficulty"] for r in rows if not any(ok(r, a.name) for a in DEFAULT_ARMS)]
    assert sum(easy) / len(easy) < sum(hard) / len(hard) - 1.0


def test_collapsing_keeps_first_samples_and_adds_verifier_selected_best_of_n(game24_single: list[Any]) -> None:
    raw = convert_tot_logs(DATA)
    assert set(game24_single[0]["arms"]) == {
        "standard", "standard_best_of_100", "cot", "cot_best_of_100", "tot", "tot_checked",
    }  # fmt: skip
    for before, after in zip(raw, game24_single, strict=True):
        assert all(len(samples) == 1 for samples in after["arms"].values())
        assert after["arms"]["standard"][0] == before["arms"]["standard"][0]
        # The exact checker is the verifier: best-of-100 is correct when any of the 100 is.
        assert after["arms"]["cot_best_of_100"][0]["correct"] == any(s["correct"] for s in before["arms"]["cot"])
        assert after["arms"]["cot_best_of_100"][0]["cost_usd"] == pytest.approx(
            sum(s["cost_usd"] for s in before["arms"]["cot"]), abs=1e-6
        )
        assert after["arms"]["tot"] == before["arms"]["tot"]


def test_collapsing_with_a_noisy_verifier_follows_its_rates() -> None:
    row = {
        "task_id": "t",
        "arms": {"a": [{"correct": i == 7, "input_tokens": 1, "output_tokens": 1, "cost_usd": 0.01,
                        "latency_s": 1.0 + i / 100, "answer": str(i)} for i in range(10)]},
        "verifier": {"cost_usd": 0.5, "latency_s": 2.0, "true_positive_rate": 1.0, "false_positive_rate": 0.0},
    }  # fmt: skip
    (exact,) = collapse_to_single([row], best_of=10)
    assert exact["arms"]["a_best_of_10"][0]["answer"] == "7"
    assert exact["arms"]["a_best_of_10"][0]["cost_usd"] == pytest.approx(10 * 0.01 + 10 * 0.5)
    assert exact["arms"]["a_best_of_10"][0]["latency_s"] == pytest.approx(1.09 + 2.0)
    row["verifier"] = {**row["verifier"], "true_positive_rate": 0.0, "false_positive_rate": 1.0}
    (lenient,) = collapse_to_single([row], best_of=10)
    assert lenient["arms"]["a_best_of_10"][0]["answer"] == "0"  # passes the first sample, wrong


@pytest.mark.parametrize("seed", [1, 2])
def test_on_synthetic_single_outcome_tables_an_adaptive_policy_matches_the_best_arm_at_under_0_6x_spend(
    seed: int,
) -> None:
    evaluation = _evaluate(synthetic_tasks(1300, seed=seed))
    report = evaluation.report
    assert report["tasks"] == {"train": 650, "test": 650}
    best = _best_fixed(report)
    assert best["name"] == "single:large_best_of_100"
    adaptive = [p for p in report["policies"] if p["kind"] == "adaptive"]
    assert {p["name"] for p in adaptive} == {"cascade", "router"}
    winners = [
        p
        for p in adaptive
        if p["success_rate"] >= best["success_rate"] - 0.01
        and p["spend_per_success_usd"] <= 0.6 * best["spend_per_success_usd"]
        and p["deadline_miss_rate"] <= best["deadline_miss_rate"]
    ]
    assert winners, f"no adaptive policy reaches {best}: {adaptive}"
    cascade = _adaptive(report, "cascade")
    assert cascade["verifier_spend_usd"] > 0  # the verifier is charged
    fit = cascade["fit"]
    assert fit["versus"]["policy"] == best["name"]
    assert fit["versus"]["spend_per_success_ratio"] == pytest.approx(
        cascade["spend_per_success_usd"] / best["spend_per_success_usd"]
    )
    assert "match single:large_best_of_100's training success" in fit["why"]
    assert any(line.startswith("cascade vs single:large_best_of_100 on the test part") for line in evaluation.trades)


def test_on_the_collapsed_game24_logs_the_cascade_beats_the_best_arm(game24_single: list[Any]) -> None:
    report = _evaluate(game24_single, deadline_s=600.0).report
    best = _best_fixed(report)
    assert best["name"] == "single:tot_checked"
    cascade = _adaptive(report, "cascade")
    assert cascade["success_rate"] >= best["success_rate"]
    assert cascade["deadline_miss_rate"] <= best["deadline_miss_rate"]
    assert cascade["spend_per_success_usd"] < best["spend_per_success_usd"]
    # The stages before the strong arm are the cheap single answers, verified by the free checker.
    assert cascade["fit"]["policy"].startswith("single:standard:verified")
    # Why it saves ~10 % here, not 40 %: even a clairvoyant policy (only the cheapest correct
    # arm paid, nothing spent on tasks no arm solves, no deadline) needs about 0.6x (0.598x).
    _, test = split_tasks(parse_tasks([json.dumps(r) for r in game24_single]), 0.5)
    paid = [min(s[0].cost_usd for s in t.arms.values() if s[0].correct) for t in test
            if any(s[0].correct for s in t.arms.values())]  # fmt: skip
    assert sum(paid) / len(paid) > 0.59 * best["spend_per_success_usd"]


def test_a_per_task_dollar_budget_holds_for_cascades_and_routers_verifier_included() -> None:
    rows = synthetic_tasks(400, seed=6)
    budget = 0.0375  # the large model's answer plus a few verifications, not its best-of-100
    report = evaluate_policies(parse_tasks([json.dumps(r) for r in rows]), budget_usd=budget).report
    test_tasks = report["tasks"]["test"]
    for policy in report["policies"]:
        assert policy["total_spend_usd"] <= budget * test_tasks + 1e-9, policy["name"]
    assert _adaptive(report, "single:large_best_of_100")["success_rate"] == 0.0  # refused outright
    cascade = _adaptive(report, "cascade")
    # What fits: try the small model, verify, escalate to the large one; cheaper per success than it.
    assert cascade["fit"]["policy"] == "single:small:verified + single:large"
    assert cascade["verifier_spend_usd"] > 0
    assert cascade["spend_per_success_usd"] < _adaptive(report, "single:large")["spend_per_success_usd"]


def test_without_a_verifier_the_cascade_escalates_on_disagreement(tmp_path: Path) -> None:
    rows = synthetic_tasks(1300, seed=1)
    for row in rows:
        del row["verifier"]
    evaluation = _evaluate(rows)
    best, cascade = _best_fixed(evaluation.report), _adaptive(evaluation.report, "cascade")
    assert cascade["fit"]["policy"].startswith("agree:")
    assert cascade["verifier_spend_usd"] == 0
    # Agreement is a weaker signal than a verifier: close to the best arm's success, a smaller saving.
    assert cascade["success_rate"] >= best["success_rate"] - 0.02
    assert cascade["spend_per_success_usd"] < 0.9 * best["spend_per_success_usd"]
    saved = tmp_path / "fitted.json"
    save_allocators(evaluation.fitted, saved)
    assert load_allocators(saved)["cascade"].name == evaluation.fitted["cascade"].name


def test_the_router_falls_back_to_the_cascade_when_features_carry_nothing() -> None:
    blind = _evaluate(synthetic_tasks(600, seed=5, feature_signal=0.0))
    router, cascade = _adaptive(blind.report, "router"), _adaptive(blind.report, "cascade")
    assert {k: v for k, v in router.items() if k not in ("name", "fit")} == {
        k: v for k, v in cascade.items() if k not in ("name", "fit")
    }
    assert any("the features carry nothing" in note for note in blind.notes)
    informed = _evaluate(synthetic_tasks(600, seed=5, feature_signal=0.8))
    assert any(note.startswith("router: features predict solvability") for note in informed.notes)
    assert "solvability" in _adaptive(informed.report, "router")["fit"]["policy"]


def test_the_solvability_model_learns_the_direction_of_difficulty() -> None:
    rows = synthetic_tasks(2000, seed=9, feature_signal=0.8)
    tasks = parse_tasks([json.dumps(r) for r in rows])
    targets = [sum(s[0].correct for s in t.arms.values()) / len(t.arms) for t in tasks]
    model = fit_solvability([t.features for t in tasks], targets)
    # Longer prompts and the hardest tag go with harder tasks in the generator.
    weights = dict(zip(model.names, model.weights, strict=True))
    assert weights["prompt_tokens"] < 0
    assert weights["tag:proof"] < weights["tag:arithmetic"]
    short = model.predict({"prompt_tokens": 200.0, "tag:arithmetic": 1.0})
    long = model.predict({"prompt_tokens": 800.0, "tag:proof": 1.0})
    assert short > long + 0.2
    router = FeatureRouter(model, (0.3,), ())
    assert router.bin_of({"prompt_tokens": 200.0, "tag:arithmetic": 1.0}) == 1


def test_the_solvability_model_is_calibrated_on_new_tasks() -> None:
    def table(seed: int) -> tuple[list[dict[str, float]], list[float]]:
        tasks = parse_tasks([json.dumps(r) for r in synthetic_tasks(2000, seed=seed, feature_signal=0.8)])
        return [t.features for t in tasks], [sum(s[0].correct for s in t.arms.values()) / len(t.arms) for t in tasks]

    rows, targets = table(21)
    model = fit_solvability(rows, targets)
    new_rows, new_targets = table(22)
    ranked = sorted(zip((model.predict(r) for r in new_rows), new_targets, strict=True))
    fifth = len(ranked) // 5
    for k in range(5):
        chunk = ranked[k * fifth : (k + 1) * fifth]
        predicted = sum(p for p, _ in chunk) / len(chunk)
        observed = sum(y for _, y in chunk) / len(chunk)
        assert predicted == pytest.approx(observed, abs=0.04)
    assert ranked[-fifth][0] > ranked[fifth][0] + 0.15  # and it separates easy from hard tasks


def test_single_outcome_fitting_never_sees_test_labels() -> None:
    rows = synthetic_tasks(400, seed=11)
    tasks = parse_tasks([json.dumps(r) for r in rows])
    first = evaluate_policies(tasks, deadline_s=DEADLINE_S)
    _, test = split_tasks(tasks, 0.5)
    test_ids = {t.task_id for t in test}
    for row in rows:
        if row["task_id"] in test_ids:
            for samples in row["arms"].values():
                samples[0]["correct"] = not samples[0]["correct"]
    second = _evaluate(rows)
    assert first.notes == second.notes
    assert first.report != second.report


def test_synth_and_collapse_commands_write_tables_evaluate_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    synth = tmp_path / "synth.jsonl"
    assert main(["policy", "synth", "--tasks", "300", "--seed", "4", "--out", str(synth)]) == 0
    assert [json.loads(line) for line in synth.read_text().splitlines()] == synthetic_tasks(300, seed=4)
    collapsed = tmp_path / "g24-single.jsonl"
    assert main(["policy", "collapse", "--tasks", str(DATA / ".." / "missing.jsonl"), "--out", str(collapsed)]) == 1
    assert "cannot read" in capsys.readouterr().err
    g24 = tmp_path / "g24.jsonl"
    assert main(["policy", "convert-game24", "--data", str(DATA), "--out", str(g24)]) == 0
    assert main(["policy", "collapse", "--tasks", str(g24), "--out", str(collapsed), "--best-of", "100"]) == 0
    assert len(collapsed.read_text().splitlines()) == 100
    capsys.readouterr()
    assert main(["policy", "evaluate", "--tasks", str(synth), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in report["policies"] if p["kind"] == "adaptive"} == {"cascade", "router"}
    assert main(["policy", "synth", "--tasks", "0", "--out", str(synth)]) == 1
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"task_id": "a", "arms": {"x": [{"correct": true}]}}\n')
    capsys.readouterr()
    assert main(["policy", "collapse", "--tasks", str(broken), "--out", str(collapsed)]) == 1
    err = capsys.readouterr().err
    assert "task table line 1" in err
    assert "Traceback" not in err
    unwritable = tmp_path / "no-such-dir" / "fitted.json"
    assert main(["policy", "evaluate", "--tasks", str(synth), "--save-policies", str(unwritable)]) == 1
    printed = capsys.readouterr()
    assert "cascade vs single:" in printed.out  # the figures were printed before the save failed
    assert "cannot write" in printed.err
    assert main(["policy", "synth", "--tasks", "10", "--feature-signal", "2", "--out", str(synth)]) == 1
