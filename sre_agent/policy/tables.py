"""Single-outcome task tables (CONTRACTS 6): a seeded generator with a latent difficulty, and a collapser.

Real logs usually hold one outcome per arm and task: one answer from a small model,
one from a large model, one verifier-selected best-of-n answer from each. Two ways
to get such tables here:

- :func:`synthetic_tasks` draws them from a latent-difficulty model, so arms'
  outcomes are correlated the way real logs are (a hard task defeats every arm more
  often). Task ``d`` has difficulty ``z_d ~ N(0, 1)``; arm ``a`` answers correctly when
  ``skill_a - z_d + noise_{a,d} > 0`` with ``noise ~ N(0, arm_noise)``, so arm success is
  ``Phi(skill_a / sqrt(1 + arm_noise^2))``; each arm's skill is solved from its target
  success rate. Features known before any call observe the difficulty partly
  (``feature_signal`` is the correlation of log prompt length with ``z``; the task-type tag
  is the quartile of a noisy copy of ``z``); with ``feature_signal=0`` they carry nothing.
  Wrong answers repeat a per-task trap answer half the time, so answers can agree while wrong.
- :func:`collapse_to_single` turns a multi-sample table (e.g. the Game-of-24 logs) into
  one outcome per arm: each arm's first sample, and a verifier-selected best-of-n arm
  (the first of n samples the table's verifier passes, simulated with its rates and the
  seed; otherwise the majority answer), charged n samples and n verifications.

Defaults follow the table described in issue 17: a small and a large model 50x apart in
price (small $0.0007 per answer at 0.19 success; the large model's best-of-100 at 0.569
success and $0.677 per task, i.e. $1.19 per success), a verifier with stated rates.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

from sre_agent.errors import PolicyError
from sre_agent.policy.evaluate import parse_tasks, verdict_roll

__all__ = ["DEFAULT_ARMS", "ArmSpec", "collapse_to_single", "read_rows", "synthetic_tasks"]

_TAGS = ("arithmetic", "algebra", "geometry", "proof")


@dataclass(frozen=True, slots=True)
class ArmSpec:
    """One synthetic arm: its success rate over all tasks, dollars and seconds per answer, tokens."""

    name: str
    success_rate: float
    cost_usd: float
    latency_s: float
    input_tokens: int = 300
    output_tokens: int = 400


#: Small (S) and large (L) models, 50x apart in price; best-of-100 answers picked by a verifier.
DEFAULT_ARMS = (
    ArmSpec("small", 0.19, 0.0007, 3.0),
    ArmSpec("large", 0.42, 0.035, 12.0),
    ArmSpec("small_best_of_100", 0.34, 0.07, 6.0, 30_000, 40_000),
    ArmSpec("large_best_of_100", 0.569, 0.677, 25.0, 30_000, 40_000),
)
#: A learned verifier (a small reward model): cheap, fast, imperfect.
DEFAULT_VERIFIER = {"cost_usd": 0.0002, "latency_s": 1.0, "true_positive_rate": 0.9, "false_positive_rate": 0.05}


def synthetic_tasks(
    count: int,
    *,
    seed: int = 0,
    arms: Sequence[ArmSpec] = DEFAULT_ARMS,
    arm_noise: float = 0.6,
    feature_signal: float = 0.6,
    verifier: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """``count`` task rows (CONTRACTS 6) with one outcome per arm (see the module docstring).

    ``arm_noise`` is the per-(arm, task) noise's standard deviation relative to the
    difficulty's (smaller: more correlated arms). The ``difficulty`` label is written
    (policies never see it) as the latent ``z`` rounded to 3 places.
    """
    if count < 1:
        raise PolicyError("synthetic tables need at least one task")
    if not 0.0 <= feature_signal <= 1.0:
        raise PolicyError("feature_signal must be within 0..1")
    normal = NormalDist()
    spread = math.sqrt(1.0 + arm_noise**2)
    skills = {a.name: normal.inv_cdf(min(max(a.success_rate, 1e-6), 1 - 1e-6)) * spread for a in arms}
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        z = rng.gauss(0.0, 1.0)
        # Features: a log-normal prompt length correlated with z, and a type tag from a noisy z.
        log_length = 5.8 + 0.5 * (feature_signal * z + math.sqrt(1 - feature_signal**2) * rng.gauss(0.0, 1.0))
        noisy = feature_signal * z + math.sqrt(1 - feature_signal**2) * rng.gauss(0.0, 1.0)
        tag = _TAGS[min(int(normal.cdf(noisy) * len(_TAGS)), len(_TAGS) - 1)]
        prompt_tokens = round(math.exp(log_length))
        trap = f"t{rng.randrange(10**6)}"
        outcomes: dict[str, list[dict[str, Any]]] = {}
        for arm in arms:
            correct = skills[arm.name] - z + rng.gauss(0.0, arm_noise) > 0
            answer = "right" if correct else (trap if rng.random() < 0.5 else f"w{rng.randrange(10**6)}")
            outcomes[arm.name] = [
                {
                    "correct": correct,
                    "input_tokens": arm.input_tokens + prompt_tokens,
                    "output_tokens": arm.output_tokens,
                    "cost_usd": arm.cost_usd,
                    "latency_s": round(arm.latency_s * math.exp(rng.gauss(0.0, 0.2)), 3),
                    "answer": answer,
                }
            ]
        rows.append(
            {
                "task_id": f"syn-{seed}-{index}",
                "difficulty": round(z, 3),
                "tags": [tag],
                "features": {"prompt_tokens": prompt_tokens},
                "arms": outcomes,
                "verifier": dict(verifier if verifier is not None else DEFAULT_VERIFIER),
            }
        )
    return rows


def _select(row: dict[str, Any], arm: str, samples: Sequence[dict[str, Any]], seed: int) -> dict[str, Any]:
    """The first sample the row's verifier passes (its rates, seeded); otherwise the majority answer."""
    verifier = row.get("verifier")
    if verifier:
        for index, sample in enumerate(samples):
            rate = verifier["true_positive_rate"] if sample["correct"] else verifier["false_positive_rate"]
            if verdict_roll(seed, str(row["task_id"]), arm, index) < rate:
                return sample
    answered = [s for s in samples if s.get("answer")]
    if not answered:
        return samples[0]
    counts = Counter(s["answer"] for s in answered)
    return max(answered, key=lambda s: counts[s["answer"]])


def collapse_to_single(rows: Sequence[dict[str, Any]], best_of: int = 100, seed: int = 0) -> list[dict[str, Any]]:
    """Rows with one outcome per arm (see the module docstring); arms with one sample are kept as they are.

    For each arm with at least ``best_of`` samples in every row, ``<arm>`` keeps its
    first sample and ``<arm>_best_of_<n>`` is the verifier-selected answer among the
    first n, costing all n samples plus n verifications and lasting as long as the
    slowest sample plus one verification (the samples and verifications run in parallel).
    """
    if best_of < 2:
        raise PolicyError("best_of must be at least 2")
    if not rows:
        raise PolicyError("the task table holds no tasks")
    multi = {arm for arm in rows[0]["arms"] if all(len(r["arms"].get(arm, ())) >= best_of for r in rows)}
    out = []
    for row in rows:
        verifier = row.get("verifier") or {}
        arms: dict[str, list[dict[str, Any]]] = {}
        for arm, samples in row["arms"].items():
            arms[arm] = [dict(samples[0])]
            if arm not in multi:
                continue
            drawn = samples[:best_of]
            chosen = _select(row, arm, drawn, seed)
            latencies = [s["latency_s"] for s in drawn if s.get("latency_s") is not None]
            collapsed = {
                "correct": chosen["correct"],
                "input_tokens": sum(int(s["input_tokens"]) for s in drawn),
                "output_tokens": sum(int(s["output_tokens"]) for s in drawn),
                "cost_usd": round(
                    sum(float(s["cost_usd"]) for s in drawn) + best_of * float(verifier.get("cost_usd", 0.0)), 8
                ),
                "answer": chosen.get("answer", ""),
            }
            if len(latencies) == len(drawn):
                collapsed["latency_s"] = max(latencies) + float(verifier.get("latency_s", 0.0))
            else:
                # Parallel draws: the longest sample decides (the decode model derives it from tokens).
                longest = max(drawn, key=lambda s: int(s["output_tokens"]))
                collapsed["input_tokens"] = int(longest["input_tokens"])
                collapsed["output_tokens"] = int(longest["output_tokens"])
                collapsed["calls"] = int(longest.get("calls", 1))
            arms[f"{arm}_best_of_{best_of}"] = [collapsed]
        out.append({**row, "arms": arms})
    return out


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The raw rows of a ``.jsonl`` task table (for rewriting it; :func:`load_tasks` parses for evaluation)."""
    try:
        with Path(path).open() as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    except OSError as exc:
        raise PolicyError(f"cannot read task table {path}: {exc}") from exc
    except ValueError as exc:
        raise PolicyError(f"task table {path} is not JSON lines: {exc}") from exc
    # The same checks as evaluation (one readable error with the line number), before any rewriting.
    parse_tasks(json.dumps(row) for row in rows)
    return rows
