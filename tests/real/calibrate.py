"""Calibrate the simulator against the real engine (issue 15, item 4).

Replays the very requests a real run sent (same seed, same truncation) through
the simulator's vLLM model (:class:`sre_agent.replays.engine.Replica`) with the
real run's engine config (block size 128, 128 blocks, ``max_num_seqs`` 8,
``max_num_batched_tokens`` 2048: vLLM's CPU API-server default), and compares
TTFT, TPOT and queue-time quantiles with what vLLM's own spans report. Then fits
the four cost-model constants to the real run by a log-space coordinate search
and reports the gap again with the fitted profile.

    .venv/bin/python tests/real/calibrate.py FIT.duckdb [CHECK.duckdb ...] [--version v1]

Stores are ones written by :mod:`run_incidents`; their ``v1`` side is the
baseline config under the default :class:`real_engine.Workload`. The first is
fitted; the others show how the fit holds on runs it never saw.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_engine import MAX_MODEL_LEN, Workload

from sre_agent.replays.costmodel import CostModel, Profile
from sre_agent.replays.engine import EngineConfig, Replica, Seq

QUANTILES = (0.5, 0.9, 0.99)
METRICS = ("ttft", "tpot", "queue", "e2e")
# A starting point only: an A10G-like shape scaled to a 12.6 M-parameter model on one CPU core.
START = CostModel(fixed_s=0.01, prefill_token_s=2e-5, decode_seq_s=5e-4, context_token_s=1e-7)
CPU_CONFIG = EngineConfig(
    max_num_batched_tokens=2048, max_num_seqs=8, block_size=128, num_gpu_blocks=128, max_model_len=MAX_MODEL_LEN
)


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation quantile (numpy's default); ``None`` when empty."""
    data = sorted(v for v in values if v is not None and math.isfinite(v))
    if not data:
        return None
    pos = q * (len(data) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def simulate(cost: CostModel, workload: Workload, config: EngineConfig = CPU_CONFIG) -> dict[str, list[float]]:
    """Per-request TTFT, TPOT, queue and e2e seconds of the workload on the simulated engine."""
    profile = Profile("tiny-llama-cpu", "tiny-512x4", cost, kv_cache_tokens=128 * 128, max_model_len=MAX_MODEL_LEN)
    replica = Replica("cpu-0", profile, config, "v1")
    seqs = []
    for request in sorted(workload.requests(), key=lambda r: r.arrival_s):
        output = max(1, request.output_tokens)
        prompt = min(request.input_tokens, MAX_MODEL_LEN - output - 1)  # what real_engine.prompt_ids sends
        chain, left = [], prompt
        for key, tokens in request.chain:
            if left <= 0:
                break
            chain.append((key, min(tokens, left)))
            left -= tokens
        while (replica.waiting or replica.running) and replica.clock < request.arrival_s:
            replica.run(request.arrival_s)
        seq = Seq(request.request_id, chain, prompt, output, max_tokens=output, arrival_s=request.arrival_s)
        replica.submit(seq, request.arrival_s)
        seqs.append(seq)
    while replica.waiting or replica.running:
        replica.run(replica.clock + 3600.0)  # drain: any horizon past the last finish
    out: dict[str, list[float]] = {m: [] for m in METRICS}
    for seq in seqs:
        out["ttft"].append(seq.first_token_s - seq.arrival_s)
        out["queue"].append(seq.scheduled_s - seq.arrival_s)
        out["e2e"].append(seq.finish_s - seq.arrival_s)
        if seq.generated > 1:
            out["tpot"].append((seq.last_token_s - seq.first_token_s) / (seq.generated - 1))
    return out


def real(db: Path, version: str) -> dict[str, list[float]]:
    """The same per-request figures from vLLM's ``llm_request`` spans in a store."""
    from sre_agent.store.embedded import Store

    with Store.open(db, read_only=True) as store:
        rows = store.connection.execute(
            "SELECT ttft_s, tpot_s, queue_s, e2e_s FROM spans WHERE is_engine AND service_version = ?", [version]
        ).fetchall()
    return {m: [row[i] for row in rows if row[i] is not None] for i, m in enumerate(METRICS)}


def table(sim: dict[str, list[float]], actual: dict[str, list[float]]) -> list[tuple[str, float, float, float]]:
    """(metric@q, simulator, real, simulator/real) rows; the ratio is NaN where the real value is ~0."""
    rows = []
    for metric in METRICS:
        for q in QUANTILES:
            s, r = quantile(sim[metric], q), quantile(actual[metric], q)
            if s is not None and r is not None:
                rows.append((f"{metric} p{round(q * 100)}", s, r, s / r if r > 1e-4 else math.nan))
    return rows


def loss(sim: dict[str, list[float]], actual: dict[str, list[float]]) -> float:
    """Mean squared log-ratio over TTFT, TPOT and e2e quantiles (queue is mostly zero at this load)."""
    terms = [
        math.log(max(ratio, 1e-6)) ** 2
        for name, _s, _r, ratio in table(sim, actual)
        if "queue" not in name and not math.isnan(ratio)
    ]
    return sum(terms) / len(terms) if terms else math.inf


def fit(workload: Workload, actual: dict[str, list[float]], rounds: int = 6) -> CostModel:
    """Coordinate search in log space, each constant by factors 4, 2, sqrt 2, ... per round."""
    best = START
    best_loss = loss(simulate(best, workload), actual)
    step = 4.0
    for _ in range(rounds):
        for name in ("fixed_s", "prefill_token_s", "decode_seq_s", "context_token_s"):
            for factor in (step, 1 / step):
                candidate = replace(best, **{name: getattr(best, name) * factor})
                value = loss(simulate(candidate, workload), actual)
                if value < best_loss:
                    best, best_loss = candidate, value
        step = math.sqrt(step)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("db", type=Path, nargs="+", help="stores written by run_incidents.py; the first is fitted")
    parser.add_argument("--version", default="v1", help="the side run with the baseline config")
    args = parser.parse_args()
    workload = Workload()
    runs = [(db, real(db, args.version)) for db in args.db]
    fitted = fit(workload, runs[0][1])
    print(f"simulated requests: {len(workload.requests())}; fitted on {runs[0][0].name} ({args.version})")
    for title, cost in (("a-priori guess", START), ("fitted", fitted)):
        sim = simulate(cost, workload)
        print(f"\n{title}: {cost}")
        names = " | ".join(f"real {db.stem}" for db, _ in runs)
        print(f"| metric | simulator s | {names} | sim / real |\n|---|---|{'---|' * len(runs)}---|")
        rows = [table(sim, actual) for _db, actual in runs]
        for i, (name, s, _r, _ratio) in enumerate(rows[0]):
            reals = " | ".join(f"{row[i][2]:.4f}" for row in rows)
            ratios = ", ".join("–" if math.isnan(row[i][3]) else f"{row[i][3]:.2f}" for row in rows)
            print(f"| {name} | {s:.4f} | {reals} | {ratios} |")
        gaps = ", ".join(f"{math.sqrt(loss(sim, actual)):.3f}" for _db, actual in runs)
        print(f"rms log gap over TTFT, TPOT, e2e quantiles, per real run: {gaps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
