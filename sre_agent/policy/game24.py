"""Game of 24: an exact answer checker and a converter of the Tree-of-Thoughts GPT-4 logs.

The checker is a genuine zero-cost verifier: an answer is correct when its
expression uses each of the puzzle's four numbers exactly once and evaluates to
24 (exact rational arithmetic, so ``8 / (3 - 8 / 3)`` counts). It follows the
ToT repository's ``test_output``: the last line, ``Answer:`` stripped, the part
left of ``=``.

:func:`convert_tot_logs` turns ``../shared/data/compute/tot-game24/`` (princeton-nlp/
tree-of-thought-llm @ ab40034, MIT) into a CONTRACTS 6 task table:

- ``standard`` and ``cot``: one sample per GPT-4 completion (100 per puzzle).
  The logs hold per-puzzle totals only; each completion's output tokens are the
  puzzle's completion tokens split in proportion to the completion's characters
  (largest remainder, so totals match exactly). The logs drew the 100 samples in
  5 calls of n=20 that shared a prompt, so one independent sample's input is the
  puzzle's prompt tokens / 5. Cost uses the logs' GPT-4 prices ($0.03 / $0.06 per
  1k prompt / completion tokens), which reproduce the logged dollar totals.
- ``tot``: one sample per puzzle, the whole BFS run (its real tokens and dollars),
  answering with its top-ranked candidate as ToT does.
- ``tot_checked``: the same run, with the zero-cost checker picking among its 5
  final candidates (correct when any candidate is).
Each sample carries ``calls`` (sequential model calls; 1 for single completions)
so the evaluator's decode model can derive latency; ``latency_s`` is left out.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from sre_agent.errors import PolicyError

__all__ = ["GPT4_PRICES", "TOT_FILES", "check_answer", "convert_tot_logs", "extract_expression", "write_jsonl"]

TOT_FILES = {
    "standard": "gpt-4_0.7_naive_standard_sample_100_start900_end1000.json",
    "cot": "gpt-4_0.7_naive_cot_sample_100_start900_end1000.json",
    "tot": "gpt-4_0.7_propose1_value3_greedy5_start900_end1000.json",
}
#: Dollars per token (prompt, completion): GPT-4 8k, 2023, as used to compute the logs' costs.
GPT4_PRICES = (0.03 / 1000, 0.06 / 1000)
_CALL_BATCH = 20  # the ToT code requests n samples in calls of at most 20

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def extract_expression(output: str) -> str:
    """The expression of an output's last line (``Answer:`` stripped, left of ``=``); '' when none."""
    lines = output.strip().split("\n")
    if not lines:
        return ""
    last = lines[-1].strip()
    lowered = last.lower()
    if "answer:" in lowered:
        last = last[lowered.index("answer:") + len("answer:") :]
    return last.split("=")[0].strip()


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError("not an arithmetic expression")


def check_answer(puzzle: str | Sequence[int], output: str) -> bool:
    """True when ``output``'s answer uses exactly the puzzle's numbers and equals 24."""
    numbers = re.findall(r"\d+", puzzle) if isinstance(puzzle, str) else [str(n) for n in puzzle]
    expression = extract_expression(output).replace("×", "*").replace("÷", "/")
    if sorted(re.findall(r"\d+", expression)) != sorted(numbers):
        return False
    try:
        return _evaluate(ast.parse(expression, mode="eval")) == 24
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return False


def _split_tokens(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder; sums exactly to total)."""
    weight_sum = sum(weights) or len(weights)
    shares = [total * (w if sum(weights) else 1) / weight_sum for w in weights]
    floors = [math.floor(s) for s in shares]
    order = sorted(range(len(shares)), key=lambda i: shares[i] - floors[i], reverse=True)
    for i in order[: total - sum(floors)]:
        floors[i] += 1
    return floors


def _per_puzzle(entries: Sequence[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], int, int, float]]:
    """Each entry with its own (prompt tokens, completion tokens, dollars) from cumulative usage."""
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}
    previous = zero
    for entry in entries:
        usage = entry["usage_so_far"]
        if usage["prompt_tokens"] < previous["prompt_tokens"] or usage["cost"] < previous["cost"]:
            # The run was resumed here (the CoT log restarts its counters at puzzle 932):
            # the cumulative figures start again from this puzzle.
            previous = zero
        yield (
            entry,
            usage["prompt_tokens"] - previous["prompt_tokens"],
            usage["completion_tokens"] - previous["completion_tokens"],
            usage["cost"] - previous["cost"],
        )
        previous = usage


def _sample_arm(entry: dict[str, Any], prompt: int, completion: int, puzzle: str, labels: list[bool]) -> list[Any]:
    outputs: list[str] = entry["ys"]
    calls = math.ceil(len(outputs) / _CALL_BATCH)
    input_tokens = round(prompt / calls)
    output_tokens = _split_tokens(completion, [len(y) for y in outputs])
    price_in, price_out = GPT4_PRICES
    return [
        {
            "correct": label,
            "input_tokens": input_tokens,
            "output_tokens": out,
            "cost_usd": round(input_tokens * price_in + out * price_out, 8),
            "answer": extract_expression(text).replace(" ", ""),
            "calls": 1,
        }
        for text, label, out in zip(outputs, labels, output_tokens, strict=True)
    ]


def _tot_calls(entry: dict[str, Any]) -> int:
    """Sequential calls of one BFS run: a proposal call per kept state, a value call per new state."""
    return sum(len(step["ys"]) + len(set(step["new_ys"])) for step in entry["steps"])


def convert_tot_logs(folder: str | Path, check: bool = True) -> list[dict[str, Any]]:
    """The CONTRACTS 6 task table from the three ToT Game-of-24 logs in ``folder``.

    With ``check`` the log's own labels are compared with :func:`check_answer`; a
    disagreement raises :class:`PolicyError` (the table would then be wrong).
    """
    root = Path(folder)
    try:
        logs = {arm: json.loads((root / name).read_text()) for arm, name in TOT_FILES.items()}
    except (OSError, ValueError) as exc:
        raise PolicyError(f"cannot read the Game-of-24 logs in {root}: {exc}") from exc
    tot_by_idx = {entry["idx"]: entry for entry in logs["tot"]}
    tasks: dict[int, dict[str, Any]] = {}
    for arm in ("standard", "cot"):
        for entry, prompt, completion, _ in _per_puzzle(logs[arm]):
            puzzle = tot_by_idx[entry["idx"]]["steps"][0]["x"]
            if arm == "standard":
                labels = [bool(a) for a in entry["accs"]]
            else:
                labels = [bool(info["r"]) for info in entry["infos"]]
            if check:
                mismatched = [i for i, y in enumerate(entry["ys"]) if check_answer(puzzle, y) != labels[i]]
                if mismatched:
                    raise PolicyError(f"checker disagrees with the {arm} log on puzzle {entry['idx']}: {mismatched}")
            task = tasks.setdefault(entry["idx"], {"task_id": f"game24-{entry['idx']}", "puzzle": puzzle, "arms": {}})
            task["arms"][arm] = _sample_arm(entry, prompt, completion, puzzle, labels)
    for entry, prompt, completion, cost in _per_puzzle(logs["tot"]):
        puzzle = entry["steps"][0]["x"]
        labels = [bool(info["r"]) for info in entry["infos"]]
        chosen = next((i for i, ok in enumerate(labels) if ok), 0)
        base = {
            "input_tokens": prompt,
            "output_tokens": completion,
            "cost_usd": round(cost, 8),
            "calls": _tot_calls(entry),
        }
        task = tasks[entry["idx"]]
        task["arms"]["tot"] = [{**base, "correct": labels[0], "answer": extract_expression(entry["ys"][0])}]
        task["arms"]["tot_checked"] = [
            {**base, "correct": labels[chosen], "answer": extract_expression(entry["ys"][chosen])}
        ]
    # The checker is exact and free: a perfect verifier (the converter CLI can degrade it).
    verifier = {"cost_usd": 0.0, "latency_s": 0.0, "true_positive_rate": 1.0, "false_positive_rate": 0.0}
    return [{**tasks[idx], "verifier": verifier} for idx in sorted(tasks)]


def write_jsonl(tasks: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Write one task per line."""
    with Path(path).open("w") as handle:
        for task in tasks:
            handle.write(json.dumps(task, separators=(",", ":")) + "\n")
