"""Synthetic engine spans for the canary tests and benchmark (not collected by pytest).

Latencies follow shapes seen in vLLM traces: TTFT log-normal with a heavy
right tail (a 3 % share of long-prompt requests 4x slower), TPOT log-normal
around 30 ms, output lengths geometric-ish, queue time mostly near zero with
an exponential tail. ``ttft_scale``/``tpot_scale`` multiply every request of
a version, which is how a regression is injected.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from sre_agent.store.embedded import Store
from sre_agent.store.schema import spans_arrow_schema

NS = 1_000_000_000
T0 = 1_780_000_000 * NS


@dataclass(frozen=True)
class Profile:
    """One version's latency profile (seconds)."""

    ttft_median_s: float = 0.35
    ttft_sigma: float = 0.45
    tpot_median_s: float = 0.030
    tpot_sigma: float = 0.15
    error_rate: float = 0.002
    ttft_scale: float = 1.0
    tpot_scale: float = 1.0


def sample_latencies(rng: np.random.Generator, n: int, profile: Profile) -> dict[str, np.ndarray]:
    """Per-request ttft_s, tpot_s, output_tokens, queue_s, e2e_s and an error flag."""
    slow = rng.random(n) < 0.03
    ttft = rng.lognormal(np.log(profile.ttft_median_s), profile.ttft_sigma, n) * np.where(slow, 4.0, 1.0)
    ttft *= profile.ttft_scale
    tpot = rng.lognormal(np.log(profile.tpot_median_s), profile.tpot_sigma, n) * profile.tpot_scale
    out_tokens = rng.geometric(1 / 200, n).astype(np.int64) + 1
    queue = np.where(rng.random(n) < 0.8, 0.001, rng.exponential(0.05, n))
    e2e = queue + ttft + tpot * (out_tokens - 1)
    error = rng.random(n) < profile.error_rate
    return {"ttft_s": ttft, "tpot_s": tpot, "output_tokens": out_tokens, "queue_s": queue, "e2e_s": e2e, "error": error}


def spans_table(
    rng: np.random.Generator,
    n: int,
    version: str,
    profile: Profile,
    *,
    start_ns: int = T0,
    duration_s: float = 600.0,
    service: str = "vllm",
) -> pa.Table:
    """``n`` engine request spans of one version spread over ``duration_s`` from ``start_ns``."""
    lat = sample_latencies(rng, n, profile)
    starts = start_ns + np.sort(rng.integers(0, int(duration_s * NS), n))
    e2e_ns = (lat["e2e_s"] * NS).astype(np.int64)
    tag = uuid.uuid4().hex[:16]
    trace_ids = [f"{tag}{i:016x}" for i in range(n)]
    columns = {
        "trace_id": trace_ids,
        "span_id": [f"{i:016x}" for i in range(n)],
        "name": ["llm_request"] * n,
        "kind": ["server"] * n,
        "start_ns": starts,
        "end_ns": starts + e2e_ns,
        "duration_s": lat["e2e_s"],
        "status_code": np.where(lat["error"], "error", "unset").tolist(),
        "service_name": [service] * n,
        "service_version": [version] * n,
        "is_engine": [True] * n,
        "model": ["llama"] * n,
        "input_tokens": rng.integers(50, 2000, n),
        "output_tokens": lat["output_tokens"],
        "queue_s": lat["queue_s"],
        "ttft_s": lat["ttft_s"],
        "decode_s": lat["tpot_s"] * (lat["output_tokens"] - 1),
        "e2e_s": lat["e2e_s"],
        "tpot_s": lat["tpot_s"],
    }
    schema = spans_arrow_schema()
    arrays = []
    for f in schema:
        if f.name in columns:
            arrays.append(pa.array(columns[f.name], type=f.type))
        else:
            arrays.append(pa.nulls(n, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def write_store(path: Path | str, tables: list[pa.Table]) -> None:
    """Create a store at ``path`` and append the span tables."""
    with Store.open(path) as store:
        for t in tables:
            store.append_spans(t)


def version_pair_store(
    path: Path | str,
    *,
    n_baseline: int,
    n_candidate: int,
    candidate: Profile | None = None,
    seed: int = 0,
) -> None:
    """A store holding a concurrent v1 (baseline) / v2 (candidate) pair."""
    rng = np.random.default_rng(seed)
    write_store(
        path,
        [
            spans_table(rng, n_baseline, "v1", Profile()),
            spans_table(rng, n_candidate, "v2", candidate or Profile()),
        ],
    )
