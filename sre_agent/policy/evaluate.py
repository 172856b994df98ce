"""Offline evaluation of compute-allocation policies on task-outcome tables (CONTRACTS 6).

Policies are replayed on a table: each arm's samples are handed out in drawn
order, the verifier's verdicts come from its true/false positive rates (seeded,
so every policy sees the same verdict for the same sample), dollars include the
verifier, and time follows the samples' latencies (parallel draws cost the
slowest one). Missing latencies come from :class:`DecodeModel`.

Tasks are split once (seeded) into a training and a test part. Adaptive
policies are fitted on the training part only, using neither the test part nor
its labels; every figure reported is on the test part.

Deadline semantics: a draw (or verification) that would end after the deadline
is cut at the deadline; the task then counts as a deadline miss and not as a
success, and the cut draw is charged in full (a conservative bound on what a
cancelled request is billed). A per-task dollar budget refuses draws whose
worst case (the arm's most expensive training sample) no longer fits.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sre_agent.errors import PolicyError
from sre_agent.policy.allocate import Allocation, Allocator, BestOfN, Draw, SingleRun

__all__ = [
    "SCHEMA",
    "ArmHistory",
    "DecodeModel",
    "Evaluation",
    "PolicyRun",
    "Replay",
    "ReplaySource",
    "Sample",
    "Task",
    "evaluate_policies",
    "load_tasks",
    "parse_tasks",
    "split_tasks",
    "summarize",
    "verdict_roll",
]

SCHEMA = "sre-agent/policy-eval/v1"


@dataclass(frozen=True, slots=True)
class DecodeModel:
    """Latency of one sample when the table gives none, in seconds.

    ``calls * ttft_s + input_tokens / prefill_tokens_per_s + output_tokens / decode_tokens_per_s``.
    Defaults are GPT-4-era (2023) figures: about 0.6 s to first token per call, prompt
    processing near 2,000 tokens/s and decoding near 20 tokens/s. A multi-call sample
    (a tree search, ``calls`` > 1) pays the per-call overhead once per call.
    """

    ttft_s: float = 0.6
    prefill_tokens_per_s: float = 2000.0
    decode_tokens_per_s: float = 20.0

    def latency_s(self, input_tokens: int, output_tokens: int, calls: int = 1) -> float:
        """Seconds for a sample with these token counts."""
        return calls * self.ttft_s + input_tokens / self.prefill_tokens_per_s + output_tokens / self.decode_tokens_per_s


@dataclass(frozen=True, slots=True)
class Sample:
    """One row sample (``correct`` is never shown to policies)."""

    correct: bool
    cost_usd: float
    latency_s: float
    answer: str


@dataclass(frozen=True, slots=True)
class Verifier:
    """The table's verifier model: cost and latency per call, true/false positive rates."""

    cost_usd: float
    latency_s: float
    true_positive_rate: float
    false_positive_rate: float


@dataclass(frozen=True, slots=True)
class Task:
    """One task: samples per arm in drawn order, an optional verifier, and features known before any call.

    ``features`` holds the row's numeric ``features`` (name -> number), one ``tag:<name>``
    = 1.0 per entry of its ``tags``, and ``prompt_tokens`` (the fewest input tokens of any
    arm's first sample) unless the row names it. Never the ``difficulty`` label.
    """

    task_id: str
    arms: dict[str, tuple[Sample, ...]]
    verifier: Verifier | None
    features: dict[str, float] = field(default_factory=dict)


def _features(raw: dict[str, Any]) -> dict[str, float]:
    """What a router may know before any call (see :class:`Task`)."""
    features = {str(name): float(value) for name, value in (raw.get("features") or {}).items()}
    for tag in raw.get("tags") or ():
        features[f"tag:{tag}"] = 1.0
    firsts = [int(samples[0]["input_tokens"]) for samples in raw["arms"].values() if samples]
    if "prompt_tokens" not in features and firsts:
        features["prompt_tokens"] = float(min(firsts))
    return features


def verdict_roll(seed: int, task_id: str, arm: str, index: int) -> float:
    """A uniform number in [0, 1) fixed per (seed, task, arm, sample index): the verifier's dice."""
    token = f"{seed}:{task_id}:{arm}:{index}".encode()
    return int.from_bytes(hashlib.blake2b(token, digest_size=8).digest(), "big") / 2**64


def parse_tasks(lines: Iterable[str], decode: DecodeModel | None = None) -> list[Task]:
    """Tasks from JSON lines; latencies missing from a sample are derived with ``decode``."""
    decode = decode or DecodeModel()
    tasks: list[Task] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            arms = {
                arm: tuple(
                    Sample(
                        correct=bool(s["correct"]),
                        cost_usd=float(s["cost_usd"]),
                        latency_s=float(s["latency_s"])
                        if s.get("latency_s") is not None
                        else decode.latency_s(int(s["input_tokens"]), int(s["output_tokens"]), int(s.get("calls", 1))),
                        answer=str(s.get("answer") or ""),
                    )
                    for s in samples
                )
                for arm, samples in raw["arms"].items()
            }
            v = raw.get("verifier")
            verifier = (
                Verifier(
                    float(v["cost_usd"]),
                    float(v["latency_s"]),
                    float(v["true_positive_rate"]),
                    float(v["false_positive_rate"]),
                )
                if v
                else None
            )
            tasks.append(Task(str(raw["task_id"]), arms, verifier, _features(raw)))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise PolicyError(f"task table line {number}: {exc!r}") from exc
    if not tasks:
        raise PolicyError("the task table holds no tasks")
    return tasks


def load_tasks(path: str | Path, decode: DecodeModel | None = None) -> list[Task]:
    """Tasks from a ``.jsonl`` file (see :func:`parse_tasks`)."""
    try:
        with Path(path).open() as handle:
            return parse_tasks(handle, decode)
    except OSError as exc:
        raise PolicyError(f"cannot read task table {path}: {exc}") from exc


def split_tasks(tasks: Sequence[Task], train_fraction: float, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """A seeded split by hashed task id: (train, test); both parts are non-empty."""
    if not 0.0 < train_fraction < 1.0:
        raise PolicyError("--train-fraction must be strictly between 0 and 1")
    ordered = sorted(tasks, key=lambda t: hashlib.sha256(f"{seed}:{t.task_id}".encode()).hexdigest())
    cut = min(max(round(len(ordered) * train_fraction), 1), len(ordered) - 1)
    if cut < 1:
        raise PolicyError("need at least two tasks to split into training and test parts")
    return ordered[:cut], ordered[cut:]


@dataclass(frozen=True, slots=True)
class ArmHistory:
    """What the training part says about each arm: a conservative latency (p90) and worst-case cost."""

    latency_s: dict[str, float]
    max_cost_usd: dict[str, float]

    @classmethod
    def from_tasks(cls, tasks: Sequence[Task]) -> ArmHistory:
        """Statistics from ``tasks`` (the training part)."""
        latencies: dict[str, list[float]] = {}
        costs: dict[str, float] = {}
        for task in tasks:
            for arm, samples in task.arms.items():
                latencies.setdefault(arm, []).extend(s.latency_s for s in samples)
                costs[arm] = max([costs.get(arm, 0.0), *(s.cost_usd for s in samples)])
        p90 = {arm: sorted(v)[min(int(0.9 * len(v)), len(v) - 1)] for arm, v in latencies.items() if v}
        return cls(p90, costs)


class ReplaySource:
    """A :class:`~sre_agent.policy.allocate.SampleSource` replaying one task."""

    def __init__(
        self,
        task: Task,
        history: ArmHistory,
        deadline_s: float | None,
        budget_usd: float | None,
        seed: int = 0,
    ) -> None:
        self.task = task
        self.history = history
        self.deadline_s = deadline_s
        self.budget_usd = budget_usd
        self.seed = seed
        self.elapsed_s = 0.0
        self.spend_usd = 0.0
        self.verifier_usd = 0.0
        self.missed = False
        self._cursor: dict[str, int] = {}
        self._samples: dict[int, tuple[int, Sample]] = {}
        self._keys = 0

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline, or None."""
        return None if self.deadline_s is None else max(self.deadline_s - self.elapsed_s, 0.0)

    def features(self) -> dict[str, float]:
        """The task's features (known before any call)."""
        return self.task.features

    def expected_latency_s(self, arm: str) -> float:
        """The arm's training p90 latency (0.0 for an arm never seen in training)."""
        return self.history.latency_s.get(arm, 0.0)

    def _advance(self, seconds: float) -> bool:
        """Move time on; False (and a miss) when that passes the deadline."""
        if self.deadline_s is not None and self.elapsed_s + seconds > self.deadline_s:
            self.elapsed_s = self.deadline_s
            self.missed = True
            return False
        self.elapsed_s += seconds
        return True

    def draw(self, arm: str, n: int = 1) -> list[Draw]:
        """Up to ``n`` next samples of ``arm`` in parallel; [] after the deadline or past the dollar budget."""
        if self.missed or arm not in self.task.arms:
            return []
        samples = self.task.arms[arm]
        start = self._cursor.get(arm, 0)
        count = min(n, len(samples) - start)
        if self.budget_usd is not None:
            worst = self.history.max_cost_usd.get(arm, max((s.cost_usd for s in samples), default=0.0))
            while count > 0 and self.spend_usd + count * worst > self.budget_usd + 1e-12:
                count -= 1
        if count <= 0:
            return []
        chosen = samples[start : start + count]
        self._cursor[arm] = start + count
        self.spend_usd += sum(s.cost_usd for s in chosen)
        if not self._advance(max(s.latency_s for s in chosen)):
            return []
        draws = []
        for offset, sample in enumerate(chosen):
            self._keys += 1
            self._samples[self._keys] = (start + offset, sample)
            draws.append(Draw(self._keys, arm, sample.answer, sample.cost_usd, sample.latency_s))
        return draws

    def _verdict(self, draw: Draw, verifier: Verifier) -> bool:
        """The verifier's verdict on a sample: fixed per (seed, task, arm, sample index), whoever asks."""
        index, sample = self._samples[draw.key]
        rate = verifier.true_positive_rate if sample.correct else verifier.false_positive_rate
        if rate >= 1.0 or rate <= 0.0:
            return rate >= 1.0
        return verdict_roll(self.seed, self.task.task_id, draw.arm, index) < rate

    def verify(self, draws: Sequence[Draw]) -> list[bool]:
        """Verdicts in parallel; [] without a verifier; all False when the deadline cuts the verification
        or its cost no longer fits the dollar budget (then nothing is charged)."""
        verifier = self.task.verifier
        if verifier is None or not draws:
            return []
        cost = verifier.cost_usd * len(draws)
        if self.budget_usd is not None and self.spend_usd + cost > self.budget_usd + 1e-12:
            return [False] * len(draws)
        self.spend_usd += cost
        self.verifier_usd += cost
        if not self._advance(verifier.latency_s):
            return [False] * len(draws)
        return [self._verdict(d, verifier) for d in draws]

    def is_correct(self, draw: Draw | None) -> bool:
        """Ground truth for scoring; only the evaluator calls it, never a policy."""
        return draw is not None and self._samples[draw.key][1].correct


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One task under one policy: success, dollars (verifier included), verifier dollars, seconds, miss."""

    success: bool
    spend_usd: float
    verifier_usd: float
    latency_s: float
    missed: bool


@dataclass(frozen=True, slots=True)
class Replay:
    """How tasks are replayed: training history, deadline (s), per-task dollar budget, verifier seed."""

    history: ArmHistory
    deadline_s: float | None
    budget_usd: float | None
    seed: int = 0

    def source(self, task: Task) -> ReplaySource:
        """A fresh replay of ``task``."""
        return ReplaySource(task, self.history, self.deadline_s, self.budget_usd, self.seed)

    def runs(self, policy: Allocator, tasks: Sequence[Task]) -> list[PolicyRun]:
        """Replay ``policy`` on every task."""
        runs = []
        for task in tasks:
            source = self.source(task)
            allocation: Allocation = policy.run(source)
            success = source.is_correct(allocation.draw) and not source.missed
            runs.append(PolicyRun(success, source.spend_usd, source.verifier_usd, source.elapsed_s, source.missed))
        return runs


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    # nearest rank: the smallest value with at least 99 % of the values at or below it
    rank = max(-(-99 * len(ordered) // 100), 1)
    return ordered[rank - 1]


def summarize(name: str, kind: str, runs: Sequence[PolicyRun]) -> dict[str, Any]:
    """One ``policies`` entry of the report (CONTRACTS 6); spend per success is None without a success."""
    n = len(runs)
    successes = sum(r.success for r in runs)
    total = sum(r.spend_usd for r in runs)
    return {
        "name": name,
        "kind": kind,
        "success_rate": successes / n,
        "spend_per_success_usd": total / successes if successes else None,
        "total_spend_usd": total,
        "mean_latency_s": sum(r.latency_s for r in runs) / n,
        "p99_latency_s": _p99([r.latency_s for r in runs]),
        "deadline_miss_rate": sum(r.missed for r in runs) / n,
        "verifier_spend_usd": sum(r.verifier_usd for r in runs),
    }


@dataclass(slots=True)
class Fitted:
    """An adaptive policy chosen on the training part, its training summary, and how many were tried."""

    policy: Allocator
    train: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    candidates: int = 1
    why: str | None = None  # set when the choice was not the plain training score against the target


def fit_reason(fitted: Fitted, target: dict[str, Any]) -> str:
    """Why the training score picked ``fitted`` against ``target`` (the best fixed policy's training summary)."""
    name = target["name"]
    if score(fitted.train, target)[0] == 0:
        return (
            f"the lowest training spend per success among {fitted.candidates} candidates that match "
            f"{name}'s training success ({target['success_rate']:.3f}) and deadline misses "
            f"({target['deadline_miss_rate']:.3f})"
        )
    return f"none of {fitted.candidates} candidates matched {name}'s training success: the highest success"


def explain_fit(
    fitted: Fitted, target: dict[str, Any], tested: dict[str, Any], versus: dict[str, Any]
) -> dict[str, Any]:
    """The additive ``fit`` field of an adaptive report entry: what was chosen, why, and what it trades.

    ``target`` is the best fixed policy's training summary (what every fit aims at);
    ``tested`` and ``versus`` are the adaptive policy's and that fixed policy's test summaries.
    """
    name = target["name"]
    why = fitted.why if fitted.why is not None else fit_reason(fitted, target)
    describe = getattr(fitted.policy, "describe", None)
    ours, theirs = tested["spend_per_success_usd"], versus["spend_per_success_usd"]
    return {
        "policy": describe() if callable(describe) else fitted.policy.name,
        "why": why,
        "candidates": fitted.candidates,
        "training": {k: fitted.train[k] for k in ("success_rate", "spend_per_success_usd", "deadline_miss_rate")},
        "versus": {
            "policy": name,
            "success_delta": tested["success_rate"] - versus["success_rate"],
            "spend_per_success_ratio": ours / theirs if ours is not None and theirs else None,
            "deadline_miss_delta": tested["deadline_miss_rate"] - versus["deadline_miss_rate"],
        },
    }


def describe_trade(name: str, fit: dict[str, Any]) -> str:
    """One line: what an adaptive policy trades against the best fixed one on the test part."""
    versus = fit["versus"]
    ratio = versus["spend_per_success_ratio"]
    return (
        f"{name} vs {versus['policy']} on the test part: success {versus['success_delta']:+.3f}, "
        f"spend per success {'-' if ratio is None else f'{ratio:.2f}x'}, "
        f"deadline misses {versus['deadline_miss_delta']:+.3f}; chosen as {fit['why']}"
    )


def score(summary: dict[str, Any], target: dict[str, Any]) -> tuple[int, float, float]:
    """Sort key: feasible first (success and misses no worse than ``target``), then lower spend per success."""
    feasible = (
        summary["success_rate"] >= target["success_rate"] - 1e-9
        and summary["deadline_miss_rate"] <= target["deadline_miss_rate"] + 1e-9
    )
    per_success = summary["spend_per_success_usd"]
    return (0 if feasible else 1, -summary["success_rate"] if not feasible else 0.0, per_success or float("inf"))


def fit_best(
    name: str, candidates: Sequence[Allocator], train: Sequence[Task], replay: Replay, target: dict[str, Any]
) -> Fitted:
    """The candidate with the best training score (see :func:`score`)."""
    if not candidates:
        raise PolicyError(f"no candidates to fit {name}")
    scored = [(c, summarize(name, "adaptive", replay.runs(c, train))) for c in candidates]
    policy, summary = min(scored, key=lambda item: score(item[1], target))
    return Fitted(policy, summary, [f"{name}: chose {policy.name} {describe_training(summary)}"], len(candidates))


def describe_training(summary: dict[str, Any]) -> str:
    """A short 'on the training part: ...' phrase for notes."""
    per_success = summary["spend_per_success_usd"]
    return (
        f"(training part: success {summary['success_rate']:.2f}, "
        f"$/success {'-' if per_success is None else f'{per_success:.3f}'}, "
        f"miss {summary['deadline_miss_rate']:.2f})"
    )


#: Fixed best-of-n sizes reported besides the single runs (n samples in parallel, verifier picks).
FIXED_BEST_OF = (5, 20, 100)


def fixed_policies(tasks: Sequence[Task]) -> list[Allocator]:
    """One single-sample policy per arm present in every task (CONTRACTS 6), plus fixed best-of-n.

    Best-of-n is fixed too (it always spends n samples); it is listed for arms with at least
    n samples in every task, and only when the table has a verifier to pick with.
    """
    arms = sorted(set.intersection(*(set(t.arms) for t in tasks)))
    policies: list[Allocator] = [SingleRun(arm) for arm in arms]
    if all(t.verifier is not None for t in tasks):
        for arm in arms:
            fewest = min(len(t.arms[arm]) for t in tasks)
            policies += [BestOfN(arm, n) for n in FIXED_BEST_OF if n <= fewest]
    return policies


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The CONTRACTS 6 report, notes on what was fitted (training part only), test-part trades, and the
    fitted allocators by report name (runnable on live engines, see :mod:`sre_agent.policy.specs`)."""

    report: dict[str, Any]
    notes: list[str]
    trades: list[str] = field(default_factory=list)
    fitted: dict[str, Allocator] = field(default_factory=dict)


def evaluate_policies(
    tasks: Sequence[Task],
    *,
    deadline_s: float | None = None,
    budget_usd: float | None = None,
    train_fraction: float = 0.5,
    seed: int = 0,
) -> Evaluation:
    """Fit adaptive policies on the training part and report every policy on the test part."""
    from sre_agent.policy.fitting import adaptive_candidates

    train, test = split_tasks(tasks, train_fraction, seed)
    replay = Replay(ArmHistory.from_tasks(train), deadline_s, budget_usd, seed)
    fixed = fixed_policies(tasks)
    fixed_train = [summarize(p.name, "fixed", replay.runs(p, train)) for p in fixed]
    target = min(
        fixed_train, key=lambda s: (-s["success_rate"], s["deadline_miss_rate"], s["spend_per_success_usd"] or 0.0)
    )
    fitted = adaptive_candidates(train, replay, target)
    policies = [summarize(p.name, "fixed", replay.runs(p, test)) for p in fixed]
    versus = next(p for p in policies if p["name"] == target["name"])
    trades = []
    for name, f in fitted.items():
        entry = summarize(name, "adaptive", replay.runs(f.policy, test))
        # Additive to CONTRACTS 6: what was fitted, why, and what it trades against the target.
        entry["fit"] = explain_fit(f, target, entry, versus)
        trades.append(describe_trade(name, entry["fit"]))
        policies.append(entry)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "tasks": {"train": len(train), "test": len(test)},
        "deadline_s": deadline_s,
        "budget_usd": budget_usd,
        "policies": policies,
    }
    notes = [f"best fixed policy on the training part: {target['name']} {describe_training(target)}"]
    for f in fitted.values():
        notes.extend(f.notes)
    return Evaluation(report, notes, trades, {name: f.policy for name, f in fitted.items()})
