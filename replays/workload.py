"""Workloads for replay: trace loaders, tenants and routes, shared-prefix synthesis.

A workload is a list of :class:`WorkloadRequest` in arrival order. Each one
carries its prompt as a *prefix chain*: a list of ``(chunk_key, tokens)``
pairs whose keys identify reusable content. Two requests share a cached
prefix exactly as long as their chains start with the same keys, which is
how vLLM's prefix cache (hash of each full KV block, chained on its parent)
behaves at block granularity.

- Mooncake rows already carry anonymised block hashes (``hash_ids``, one per
  512-token block); each becomes one chunk.
- Azure rows have no prefix information, so prefixes are synthesised and
  documented here: every tenant has a fixed system prompt, and a request may
  continue one of its tenant's open conversations, in which case its prompt
  is the previous turn's prompt plus the previous answer plus a new user
  message (the history a chat client resends), sent no earlier than the
  answer could have been read. A row too short to hold the history starts a
  new conversation.

All times are seconds from the start of the replay. Randomness comes from one
``random.Random`` seeded by the caller, so a workload is a pure function of
its inputs.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import json
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sre_agent.errors import ScenarioError

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "TRACE_FILES",
    "MixShift",
    "RateChange",
    "Route",
    "Tenant",
    "TraceRow",
    "WorkloadRequest",
    "build_workload",
    "load_trace",
    "measured_prefix_reuse",
    "resolve_trace",
]

MOONCAKE_BLOCK_TOKENS = 512
_BUNDLED = Path(__file__).parent / "data"

# Short trace names -> file path relative to a traces directory (or the bundled data folder).
TRACE_FILES: dict[str, str] = {
    "azure-conv": "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
    "azure-code": "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
    "mooncake-conversation": "mooncake-fast25/conversation_trace.jsonl",
    "mooncake-synthetic": "mooncake-fast25/synthetic_trace.jsonl",
}
# Bundled with the package so that the demo and the scenarios never need ../shared.
_BUNDLED_FILES: dict[str, str] = {"azure-conv-sample": "azure_conv_sample.csv.gz"}


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One published request: arrival (s from trace start), prompt and output tokens.

    ``hash_ids`` holds Mooncake's 512-token block ids; ``None`` for traces without them.
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Route:
    """A gateway route: its dependency calls (in order) and the engine's ``max_tokens``."""

    name: str
    dependencies: tuple[str, ...] = ()
    max_tokens: int = 1024
    temperature: float = 0.7
    top_p: float = 0.95


@dataclass(frozen=True)
class Tenant:
    """A tenant: share of traffic, system prompt, conversation habit and length scaling.

    Attributes:
        weight: relative share of requests.
        system_prompt_tokens: length of the tenant's fixed system prompt (shared prefix).
        continue_prob: probability a request continues an open conversation.
        input_scale / output_scale: multipliers on the trace's token counts (a
            summarisation tenant sends longer prompts than the trace row).
        routes: route name -> relative share within the tenant.
    """

    name: str
    weight: float = 1.0
    system_prompt_tokens: int = 400
    continue_prob: float = 0.5
    input_scale: float = 1.0
    output_scale: float = 1.0
    routes: dict[str, float] = field(default_factory=lambda: {"/v1/chat/completions": 1.0})


@dataclass(frozen=True)
class RateChange:
    """From ``at_s`` on, arrivals come ``multiplier`` times faster than the trace's (time warp)."""

    at_s: float
    multiplier: float


@dataclass(frozen=True)
class MixShift:
    """From ``at_s`` on, tenant weights are replaced by ``weights`` (unnamed tenants keep theirs)."""

    at_s: float
    weights: dict[str, float]


@dataclass(slots=True)
class WorkloadRequest:
    """One logical request as the gateway receives it.

    ``chain`` is the prompt as ``(chunk_key, tokens)``; its token sum equals ``input_tokens``.
    """

    request_id: int
    arrival_s: float
    tenant: str
    route: str
    input_tokens: int
    output_tokens: int
    max_tokens: int
    temperature: float
    top_p: float
    chain: list[tuple[object, int]]
    conversation: int


# --------------------------------------------------------------------------- loading


def _search_dirs() -> list[Path]:
    """Where trace folders are looked up: $SRE_AGENT_TRACES, then ../shared/data/traces near cwd or the repo."""
    dirs: list[Path] = []
    env = os.environ.get("SRE_AGENT_TRACES")
    if env:
        dirs.append(Path(env))
    dirs.append(Path.cwd() / ".." / "shared" / "data" / "traces")
    repo = Path(__file__).resolve().parent.parent
    dirs.append(repo / ".." / "shared" / "data" / "traces")
    return dirs


def resolve_trace(name: str) -> Path:
    """Map a trace name (``azure-conv``, ``mooncake-conversation``, ``azure-conv-sample``) or a path to a file."""
    if name in _BUNDLED_FILES:
        return _BUNDLED / _BUNDLED_FILES[name]
    if name in TRACE_FILES:
        for base in _search_dirs():
            candidate = base / TRACE_FILES[name]
            if candidate.is_file():
                return candidate
        raise ScenarioError(
            f"trace {name!r} not found under {', '.join(str(d) for d in _search_dirs())} (set SRE_AGENT_TRACES)"
        )
    path = Path(name)
    if path.is_file():
        return path
    known = ", ".join(sorted([*TRACE_FILES, *_BUNDLED_FILES]))
    raise ScenarioError(f"unknown trace {name!r}: use one of {known} or a file path")


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _parse_azure_time(text: str) -> float:
    # Naive wall-clock strings with 7 fractional digits; only differences matter (rows are rebased to 0).
    return datetime.fromisoformat(text).timestamp()


def load_trace(name: str) -> tuple[TraceRow, ...]:
    """Rows of an Azure CSV (plain or gzip) or a Mooncake JSONL trace, arrivals rebased to 0 s.

    Parsed once per process and shared (rows are immutable).
    """
    return _load_trace(resolve_trace(name))


@functools.lru_cache(maxsize=8)
def _load_trace(path: Path) -> tuple[TraceRow, ...]:
    rows: list[TraceRow] = []
    with _open_text(path) as handle:
        if ".jsonl" in path.name:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    rows.append(
                        TraceRow(
                            obj["timestamp"] / 1000.0,
                            int(obj["input_length"]),
                            int(obj["output_length"]),
                            tuple(int(h) for h in obj["hash_ids"]),
                        )
                    )
                except (KeyError, ValueError, TypeError) as exc:
                    raise ScenarioError(f"{path}:{line_no}: bad Mooncake row: {exc}") from exc
        else:
            reader = csv.DictReader(handle)
            for line_no, rec in enumerate(reader, 2):
                try:
                    rows.append(
                        TraceRow(
                            _parse_azure_time(rec["TIMESTAMP"]),
                            int(rec["ContextTokens"]),
                            int(rec["GeneratedTokens"]),
                        )
                    )
                except (KeyError, ValueError) as exc:
                    raise ScenarioError(f"{path}:{line_no}: bad Azure row: {exc}") from exc
    if not rows:
        raise ScenarioError(f"{path}: trace is empty")
    t0 = rows[0].arrival_s
    return tuple(TraceRow(r.arrival_s - t0, r.input_tokens, r.output_tokens, r.hash_ids) for r in rows)


def synthetic_rows(
    rate_per_s: float, duration_s: float, seed: int, *, input_mean: int = 1000, output_mean: int = 200
) -> list[TraceRow]:
    """Poisson arrivals with log-normal prompt and output lengths (means as given, in tokens)."""
    rng = random.Random(seed)
    rows: list[TraceRow] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        if t > duration_s:
            return rows
        # lognormal with sigma 0.8: mean = exp(mu + sigma^2/2)
        inp = max(1, int(rng.lognormvariate(_mu(input_mean, 0.8), 0.8)))
        out = max(1, int(rng.lognormvariate(_mu(output_mean, 0.8), 0.8)))
        rows.append(TraceRow(t, inp, out))


def _mu(mean: float, sigma: float) -> float:
    import math

    return math.log(mean) - sigma * sigma / 2


# --------------------------------------------------------------------------- arrivals


def _warped_rows(
    rows: Sequence[TraceRow],
    duration_s: float,
    start_s: float,
    rate_scale: float,
    *,
    changes: Sequence[RateChange],
    loop_s: float | None = None,
) -> Iterator[tuple[float, TraceRow]]:
    """Yield ``(sim_time_s, row)`` with inter-arrival gaps divided by the rate multiplier in force.

    The trace is entered at ``start_s`` and looped when exhausted (or every
    ``loop_s`` seconds of trace time, so that the traffic before and after a
    deploy can be the very same slice of real traffic).
    """
    ordered = sorted(changes, key=lambda c: c.at_s)
    end = start_s + loop_s if loop_s else float("inf")
    window = [r for r in rows if start_s <= r.arrival_s < end]
    if not window:
        raise ScenarioError(f"no trace rows between {start_s} s and {end} s")
    period = loop_s if loop_s else (window[-1].arrival_s - window[0].arrival_s) * len(window) / max(1, len(window) - 1)
    idx = 0
    prev_tau = window[0].arrival_s
    loop_offset = 0.0
    t = 0.0
    while True:
        row = window[idx]
        tau = row.arrival_s + loop_offset
        multiplier = rate_scale
        for change in ordered:
            if change.at_s <= t:
                multiplier = rate_scale * change.multiplier
        t += max(0.0, tau - prev_tau) / multiplier
        if t >= duration_s:
            return
        yield t, row
        prev_tau = tau
        idx += 1
        if idx == len(window):
            idx = 0
            loop_offset += period


# --------------------------------------------------------------------------- prefixes


@dataclass
class _Conversation:
    chain: list[tuple[object, int]]
    tokens: int
    ready_s: float  # the earliest time a user sends the next turn


# A user answers only after reading the reply: the next turn of a conversation comes no
# earlier than the previous answer's generation (at a pessimistic 30 ms per token) plus
# a think time. Without this, follow-ups would race their own history into the cache.
SECONDS_PER_OUTPUT_TOKEN = 0.03
THINK_TIME_S = 10.0


class _PrefixSynth:
    """Builds prefix chains for rows without prefix information (see module docstring)."""

    def __init__(self, rng: random.Random, max_open: int = 64) -> None:
        self._rng = rng
        self._open: dict[str, list[tuple[int, _Conversation]]] = {}
        self._max_open = max_open
        self._next_conv = 0

    def chain_for(
        self, rid: int, tenant: Tenant, input_tokens: int, now_s: float
    ) -> tuple[list[tuple[object, int]], int]:
        convs = self._open.setdefault(tenant.name, [])
        if convs and self._rng.random() < tenant.continue_prob:
            pick = self._rng.randrange(len(convs))
            conv_id, conv = convs[pick]
            if conv.tokens < input_tokens and conv.ready_s <= now_s:
                chain = [*conv.chain, (("user", rid), input_tokens - conv.tokens)]
                convs.pop(pick)
                return chain, conv_id
        system = tenant.system_prompt_tokens
        self._next_conv += 1
        if input_tokens > system > 0:
            chain = [(("system", tenant.name, system), system), (("user", rid), input_tokens - system)]
        else:
            chain = [(("user", rid), input_tokens)]
        return chain, self._next_conv

    def finished_turn(self, tenant: str, conv_id: int, req: WorkloadRequest) -> None:
        """Open the conversation for a follow-up: history = prompt + this turn's answer."""
        chain = [*req.chain, (("answer", req.request_id), req.output_tokens)]
        convs = self._open.setdefault(tenant, [])
        ready = req.arrival_s + req.output_tokens * SECONDS_PER_OUTPUT_TOKEN + THINK_TIME_S
        convs.append((conv_id, _Conversation(chain, req.input_tokens + req.output_tokens, ready)))
        if len(convs) > self._max_open:
            convs.pop(0)


def _mooncake_chain(row: TraceRow, input_tokens: int) -> list[tuple[object, int]]:
    assert row.hash_ids is not None
    chain: list[tuple[object, int]] = []
    left = input_tokens
    for h in row.hash_ids:
        n = min(MOONCAKE_BLOCK_TOKENS, left)
        if n <= 0:
            break
        # A key stands for the same tokens wherever it appears: a block cut short (the prompt was
        # scaled down inside it) is other content than the whole block, so it gets its own key.
        chain.append((("mc", h) if n == MOONCAKE_BLOCK_TOKENS else ("mc", h, n), n))
        left -= n
    if left > 0:
        chain.append((("tail", len(chain)), left))
    return chain


def measured_prefix_reuse(requests: Sequence[WorkloadRequest]) -> float:
    """Share of input tokens covered by a leading run of chunks seen earlier (unbounded cache, empty at start).

    This is the trace README's "prefix-hit tokens" measure, applied to the chains.
    """
    seen: set[object] = set()
    hit = total = 0
    for req in requests:
        leading = True
        for key, n in req.chain:
            if leading and key in seen:
                hit += n
            else:
                leading = False
            seen.add(key)
        total += req.input_tokens
    return hit / total if total else 0.0


# --------------------------------------------------------------------------- build


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    total = sum(weights.values())
    x = rng.random() * total
    for name, w in weights.items():
        x -= w
        if x <= 0:
            return name
    return next(reversed(weights))


def build_workload(
    rows: Sequence[TraceRow],
    *,
    duration_s: float,
    tenants: Sequence[Tenant],
    routes: dict[str, Route],
    seed: int,
    start_s: float = 0.0,
    rate_scale: float = 1.0,
    loop_s: float | None = None,
    rate_changes: Sequence[RateChange] = (),
    mix_shifts: Sequence[MixShift] = (),
    template_breaks_at_s: float | None = None,
) -> list[WorkloadRequest]:
    """Turn trace rows into gateway requests for ``duration_s`` seconds of replay.

    ``loop_s``: replay only ``loop_s`` seconds of the trace from ``start_s``, over and over.
    ``template_breaks_at_s``: from then on the prompt template puts a
    per-request value (a timestamp, a request id) at the top of the prompt,
    so the first chunk of every chain becomes unique and no prefix is shared.
    """
    if not tenants:
        raise ScenarioError("workload needs at least one tenant")
    rng = random.Random(seed)
    synth = _PrefixSynth(random.Random(seed + 1))
    by_name = {t.name: t for t in tenants}
    base_weights = {t.name: t.weight for t in tenants}
    shifts = sorted(mix_shifts, key=lambda m: m.at_s)
    out: list[WorkloadRequest] = []
    for rid, (t, row) in enumerate(
        _warped_rows(rows, duration_s, start_s, rate_scale, changes=rate_changes, loop_s=loop_s)
    ):
        weights = dict(base_weights)
        for shift in shifts:
            if shift.at_s <= t:
                weights.update(shift.weights)
        tenant = by_name[_pick(rng, weights)]
        route_name = _pick(rng, tenant.routes)
        route = routes.get(route_name)
        if route is None:
            raise ScenarioError(f"tenant {tenant.name!r} uses unknown route {route_name!r}")
        input_tokens = max(1, round(row.input_tokens * tenant.input_scale))
        output_tokens = max(1, min(route.max_tokens, round(row.output_tokens * tenant.output_scale)))
        if row.hash_ids is not None:
            chain = _mooncake_chain(row, input_tokens)
            conv = rid
        else:
            chain, conv = synth.chain_for(rid, tenant, input_tokens, t)
        if template_breaks_at_s is not None and t >= template_breaks_at_s:
            chain = [(("templated", rid), chain[0][1]), *chain[1:]]
        req = WorkloadRequest(
            request_id=rid,
            arrival_s=t,
            tenant=tenant.name,
            route=route_name,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            max_tokens=route.max_tokens,
            temperature=route.temperature,
            top_p=route.top_p,
            chain=chain,
            conversation=conv,
        )
        if row.hash_ids is None:
            synth.finished_turn(tenant.name, conv, req)
        out.append(req)
    return out
