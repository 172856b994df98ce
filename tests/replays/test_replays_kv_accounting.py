"""KV block accounting of the simulated engine: every block taken is given back.

A leak here does not fail loudly: blocks nobody holds add up until the head of the
queue no longer fits, and the replay then never ends (incident seed 900185 did that).
"""

from __future__ import annotations

from sre_agent.replays.costmodel import PROFILES
from sre_agent.replays.engine import EngineConfig, Replica, Seq


def _drain(replica: Replica) -> None:
    while replica.waiting or replica.running:
        replica.run(replica.clock + 3600.0)


def test_a_prompt_ending_inside_a_cached_chunk_leaks_no_block() -> None:
    replica = Replica("r0", PROFILES["llama3-8b-h100"], EngineConfig(num_gpu_blocks=64), "v1")
    long = Seq("a", [("system", 512)], 512, 4, max_tokens=4, arrival_s=0.0)
    replica.submit(long, 0.0)
    _drain(replica)
    assert replica.pool.used == 0  # its 32 prompt blocks stay cached, evictable
    # The same chunk key with fewer tokens: the prompt ends 100 tokens into the cached chunk,
    # so its reference covers more blocks (32) than the request needs (7).
    short = Seq("b", [("system", 100)], 100, 4, max_tokens=4, arrival_s=replica.clock)
    replica.submit(short, replica.clock)
    _drain(replica)
    assert short.cached_tokens == 96  # whole blocks of the hit, short of the last token
    assert replica.pool.used == 0
    assert replica.pool.available() == 64


def test_blocks_come_back_after_preemption_under_a_small_pool() -> None:
    replica = Replica("r0", PROFILES["llama3-8b-h100"], EngineConfig(num_gpu_blocks=40), "v1")
    seqs = [
        Seq(f"q{i}", [("shared", 200), (("own", i), 100 + 37 * i)], 300 + 37 * i, 120, max_tokens=120, arrival_s=0.0)
        for i in range(6)
    ]
    for seq in seqs:
        replica.submit(seq, 0.0)
    _drain(replica)
    assert replica.stats.preemptions > 0  # the pool is too small for all six at once
    assert all(seq.generated == 120 for seq in seqs)
    assert replica.pool.used == 0
