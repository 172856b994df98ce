"""``sre-agent policy``: offline evaluation of compute-allocation policies (CONTRACTS 6)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from sre_agent.errors import UsageError

if TYPE_CHECKING:
    from sre_agent.policy.evaluate import DecodeModel, Evaluation

__all__ = ["register"]

EPILOG = """examples:
  sre-agent policy convert-game24 --out game24.jsonl
  sre-agent policy collapse --tasks game24.jsonl --out game24-single.jsonl
  sre-agent policy synth --tasks 1300 --seed 1 --out synth.jsonl
  sre-agent policy evaluate --tasks game24.jsonl --deadline 600 --train-fraction 0.5
  sre-agent policy evaluate --tasks game24.jsonl --format json > eval.json
  sre-agent policy evaluate --tasks synth.jsonl --save-policies fitted.json
"""

DEFAULT_GAME24 = "../shared/data/compute/tot-game24"


def register(subparsers: Any) -> None:
    """Add ``policy evaluate``, ``convert-game24``, ``collapse`` and ``synth``."""
    parser = subparsers.add_parser(
        "policy",
        help="evaluate retry/compute-allocation policies offline",
        description="Replay compute-allocation policies on task-outcome tables (fit on train, report on test).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda args: _help(parser))

    ev = sub.add_parser(
        "evaluate",
        help="report success, spend per success, latency and deadline misses per policy",
        description="Fit adaptive policies on the training part of a task table and report every policy "
        "(each arm as a fixed policy, plus adaptive ones) on the test part.",
        epilog="example:\n  sre-agent policy evaluate --tasks game24.jsonl --deadline 600\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument("--tasks", required=True, metavar="FILE", help="task-outcome table (.jsonl, CONTRACTS 6)")
    ev.add_argument("--deadline", type=float, metavar="S", help="per-task deadline in seconds (default: none)")
    ev.add_argument("--budget-usd", type=float, metavar="X", help="per-task dollar budget (default: none)")
    ev.add_argument("--train-fraction", type=float, default=0.5, metavar="F", help="training share (default 0.5)")
    ev.add_argument("--seed", type=int, default=0, help="split and verifier seed (default 0)")
    decode = ev.add_argument_group("decode model for samples without latency_s")
    decode.add_argument("--ttft-s", type=float, default=0.6, help="seconds to first token per call (default 0.6)")
    decode.add_argument("--prefill-tps", type=float, default=2000.0, help="prompt tokens/s (default 2000)")
    decode.add_argument("--decode-tps", type=float, default=20.0, help="output tokens/s (default 20, GPT-4 era)")
    ev.add_argument("--format", choices=("text", "json", "markdown"), default="text", help="output format")
    ev.add_argument(
        "--save-policies",
        metavar="FILE",
        help="write the fitted adaptive policies as JSON a gateway loads (sre_agent.policy.load_allocators)",
    )
    ev.set_defaults(func=_evaluate)

    conv = sub.add_parser(
        "convert-game24",
        help="convert the Tree-of-Thoughts Game-of-24 GPT-4 logs into a task table",
        description="Convert ../shared/data/compute/tot-game24 (princeton-nlp/tree-of-thought-llm, MIT) "
        "into a CONTRACTS 6 task table; the exact answer checker is the (zero-cost) verifier.",
        epilog="example:\n  sre-agent policy convert-game24 --out game24.jsonl --verifier-fpr 0.05\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    conv.add_argument("--data", default=DEFAULT_GAME24, metavar="DIR", help=f"log folder (default {DEFAULT_GAME24})")
    conv.add_argument("--out", required=True, metavar="FILE", help="output .jsonl")
    conv.add_argument("--verifier-tpr", type=float, default=1.0, help="model a learned verifier: true-positive rate")
    conv.add_argument("--verifier-fpr", type=float, default=0.0, help="model a learned verifier: false-positive rate")
    conv.add_argument("--verifier-cost-usd", type=float, default=0.0, help="dollars per verification (default 0)")
    conv.add_argument("--verifier-latency-s", type=float, default=0.0, help="seconds per verification (default 0)")
    conv.set_defaults(func=_convert)

    col = sub.add_parser(
        "collapse",
        help="rewrite a task table with one outcome per arm (first sample, verifier-selected best-of-n)",
        description="Collapse every arm to its first sample and add <arm>_best_of_<n>: the first of n samples "
        "the table's verifier passes (its rates, seeded), charged n samples and n verifications.",
        epilog="example:\n  sre-agent policy collapse --tasks game24.jsonl --out game24-single.jsonl --best-of 100\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    col.add_argument("--tasks", required=True, metavar="FILE", help="task-outcome table (.jsonl, CONTRACTS 6)")
    col.add_argument("--out", required=True, metavar="FILE", help="output .jsonl")
    col.add_argument("--best-of", type=int, default=100, metavar="N", help="samples per best-of arm (default 100)")
    col.add_argument("--seed", type=int, default=0, help="verifier seed (default 0)")
    col.set_defaults(func=_collapse)

    syn = sub.add_parser(
        "synth",
        help="write a synthetic single-outcome task table (latent per-task difficulty, seeded)",
        description="Draw a single-outcome task table: a small and a large model 50x apart in price, their "
        "verifier-selected best-of-100 answers, a learned verifier; a latent difficulty per task "
        "correlates the arms' outcomes and, partly, the features (prompt length, a type tag).",
        epilog="example:\n  sre-agent policy synth --tasks 1300 --seed 1 --out synth.jsonl\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    syn.add_argument("--tasks", type=int, default=1300, metavar="N", help="number of tasks (default 1300)")
    syn.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    syn.add_argument(
        "--feature-signal",
        type=float,
        default=0.6,
        metavar="R",
        help="correlation of the features with difficulty, 0..1 (default 0.6; 0: features carry nothing)",
    )
    syn.add_argument("--out", required=True, metavar="FILE", help="output .jsonl")
    syn.set_defaults(func=_synth)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_table(report: dict[str, Any], markdown: bool) -> str:
    """The policies as a text or Markdown table."""
    header = ("policy", "kind", "success", "$/success", "total $", "mean s", "p99 s", "miss", "verifier $")
    rows = [
        (
            p["name"],
            p["kind"],
            _fmt(p["success_rate"], 2),
            _fmt(p["spend_per_success_usd"]),
            _fmt(p["total_spend_usd"], 2),
            _fmt(p["mean_latency_s"], 1),
            _fmt(p["p99_latency_s"], 1),
            _fmt(p["deadline_miss_rate"], 2),
            _fmt(p["verifier_spend_usd"], 2),
        )
        for p in report["policies"]
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows])


def _evaluate(args: argparse.Namespace) -> int:
    from sre_agent.policy.evaluate import DecodeModel, evaluate_policies, load_tasks

    if args.deadline is not None and args.deadline <= 0:
        raise UsageError("--deadline must be positive")
    decode = DecodeModel(args.ttft_s, args.prefill_tps, args.decode_tps)
    tasks = load_tasks(args.tasks, decode)
    evaluation = evaluate_policies(
        tasks,
        deadline_s=args.deadline,
        budget_usd=args.budget_usd,
        train_fraction=args.train_fraction,
        seed=args.seed,
    )
    _print_evaluation(evaluation, decode, args.format)
    if args.save_policies:  # after printing: a path that cannot be written loses no figures
        from sre_agent.policy.specs import save_allocators

        save_allocators(evaluation.fitted, args.save_policies)
    return 0


def _print_evaluation(evaluation: Evaluation, decode: DecodeModel, fmt: str) -> None:
    """The report as JSON, or as a table followed by the fit notes and test-part trades."""
    report = evaluation.report
    if fmt == "json":
        print(json.dumps(report, indent=2))
        return
    markdown = fmt == "markdown"
    split = report["tasks"]
    print(
        f"{split['train']} training / {split['test']} test tasks; deadline {report['deadline_s']} s; "
        f"budget {report['budget_usd']} $; decode model: {decode.ttft_s} s per call + "
        f"{decode.prefill_tokens_per_s:g} prompt tok/s + {decode.decode_tokens_per_s:g} output tok/s\n"
    )
    print(render_table(report, markdown))
    print()
    for note in [*evaluation.notes, *evaluation.trades]:
        print(f"- {note}" if markdown else note)


def _convert(args: argparse.Namespace) -> int:
    from sre_agent.policy.game24 import convert_tot_logs, write_jsonl

    for name in ("verifier_tpr", "verifier_fpr"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise UsageError(f"--{name.replace('_', '-')} must be within 0..1")
    tasks = convert_tot_logs(args.data)
    verifier = {
        "cost_usd": args.verifier_cost_usd,
        "latency_s": args.verifier_latency_s,
        "true_positive_rate": args.verifier_tpr,
        "false_positive_rate": args.verifier_fpr,
    }
    for task in tasks:
        task["verifier"] = verifier
    write_jsonl(tasks, args.out)
    arms = sorted(tasks[0]["arms"]) if tasks else []
    print(f"wrote {len(tasks)} tasks ({', '.join(arms)}) to {args.out}", file=sys.stderr)
    return 0


def _collapse(args: argparse.Namespace) -> int:
    from sre_agent.policy.game24 import write_jsonl
    from sre_agent.policy.tables import collapse_to_single, read_rows

    rows = collapse_to_single(read_rows(args.tasks), best_of=args.best_of, seed=args.seed)
    write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} tasks ({', '.join(sorted(rows[0]['arms']))}) to {args.out}", file=sys.stderr)
    return 0


def _synth(args: argparse.Namespace) -> int:
    from sre_agent.policy.game24 import write_jsonl
    from sre_agent.policy.tables import synthetic_tasks

    rows = synthetic_tasks(args.tasks, seed=args.seed, feature_signal=args.feature_signal)
    write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} tasks ({', '.join(sorted(rows[0]['arms']))}) to {args.out}", file=sys.stderr)
    return 0
