"""One vLLM replica: V1 iteration-level scheduling over a paged KV cache.

Each call to :meth:`Replica.run` executes one engine step the way vLLM V1's
``Scheduler.schedule`` builds it (``vllm/v1/core/sched/scheduler.py``):

1. **Running requests first**, in order, each asking for
   ``num_tokens - num_computed_tokens`` new tokens (1 for a decode, the rest
   of the prompt for a prefill), capped by the step's token budget
   ``max_num_batched_tokens`` when chunked prefill is on (with it off a prompt
   is only scheduled whole). If the KV blocks for those tokens are not
   available, the *last* running request is preempted (its blocks freed, its
   progress dropped, recomputation later) until they are.
2. **Then waiting requests** (FCFS), if nothing was preempted, while budget,
   ``max_num_seqs`` and KV blocks allow. A newly scheduled request first looks
   its prompt up in the prefix cache; cached tokens are not recomputed (at
   least one token always is, as in vLLM).
3. The step takes ``CostModel.step_s`` of the batch; every request whose
   tokens are all computed samples one token.

Runs of identical decode-only steps (no prefill, nothing admissible, no
finish and no block shortage in between) are executed in one call: their
durations form an arithmetic ramp, so the result equals stepping one by one
(see the fidelity tests) at a fraction of the cost. A run stops at the first
step boundary at or after ``horizon_s``, the time of the next outside event,
so a request arriving mid-step still joins at the next step boundary.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

from sre_agent.replays.costmodel import Profile
from sre_agent.replays.kvcache import BlockPool
from sre_agent.replays.stats import ReplicaStats

__all__ = ["EngineConfig", "Replica", "Seq"]


@dataclass(frozen=True)
class EngineConfig:
    """vLLM engine arguments that shape scheduling, plus cost-model factors.

    Attributes:
        num_gpu_blocks: KV blocks; ``None`` = the profile's capacity / block_size.
        max_model_len: prompt + ``max_tokens`` limit; ``None`` = the profile's.
        prefill_factor / decode_factor: multipliers on the cost model
            (a kernel regression is an input of a replay, not an output).
    """

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    num_gpu_blocks: int | None = None
    block_size: int = 16
    max_model_len: int | None = None
    prefill_factor: float = 1.0
    decode_factor: float = 1.0

    def with_updates(self, **changes: object) -> EngineConfig:
        """A copy with some fields replaced."""
        return replace(self, **changes)  # type: ignore[arg-type]


class Seq:
    """One request inside a replica, with the timestamps vLLM's span reports (seconds of simulated time).

    ``-1.0`` marks a timestamp that has not happened (yet).
    """

    __slots__ = (
        "arrival_s",
        "cached_tokens",
        "chain",
        "computed",
        "finish_reason",
        "finish_s",
        "first_token_s",
        "generated",
        "held",
        "key",
        "last_token_s",
        "max_tokens",
        "preemptions",
        "private_blocks",
        "prompt_len",
        "reg_end",
        "reg_idx",
        "reg_start",
        "scheduled_s",
        "shared_blocks",
        "target_out",
    )

    def __init__(
        self,
        key: object,
        chain: list[tuple[object, int]],
        prompt_len: int,
        target_out: int,
        *,
        max_tokens: int,
        arrival_s: float,
    ) -> None:
        self.key = key
        self.chain = chain
        self.prompt_len = prompt_len
        self.target_out = target_out
        self.max_tokens = max_tokens
        self.arrival_s = arrival_s
        self.generated = 0
        self.computed = 0
        self.held: list[object] = []
        self.shared_blocks = 0
        self.private_blocks = 0
        self.reg_idx = 0
        self.reg_start = 0
        self.reg_end = 0
        self.scheduled_s = -1.0
        self.first_token_s = -1.0
        self.last_token_s = -1.0
        self.finish_s = -1.0
        self.cached_tokens = -1
        self.preemptions = 0
        self.finish_reason = ""


class Replica:
    """A vLLM engine: scheduler, KV block pool with prefix cache, cost model and statistics.

    ``merge_decode_steps`` (class attribute) executes runs of identical decode
    steps in one call; switching it off steps one by one (the fidelity tests
    check both give the same result).

    Attributes:
        name: ``host.name`` of the replica.
        version: ``service.version`` it currently runs.
        clock: end of its last executed step, seconds.
        finished: requests finished or failed since the caller last drained it.
    """

    merge_decode_steps = True

    def __init__(self, name: str, profile: Profile, config: EngineConfig, version: str) -> None:
        self.name = name
        self.profile = profile
        self.version = version
        self.config = config
        self.pool = BlockPool(self._blocks(config), config.block_size, config.enable_prefix_caching)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.clock = 0.0
        self.stats = ReplicaStats()
        self.finished: list[Seq] = []
        self.routable = True
        # True while the last step was a decode run and nothing has changed since:
        # the next step is then known to be the same kind of step (fast path).
        self._steady = False

    # ------------------------------------------------------------------ configuration
    def _blocks(self, config: EngineConfig) -> int:
        if config.num_gpu_blocks is not None:
            return config.num_gpu_blocks
        return self.profile.kv_cache_tokens // config.block_size

    def max_model_len(self) -> int:
        """Longest prompt + max_tokens accepted, tokens."""
        return self.config.max_model_len or self.profile.max_model_len

    def reconfigure(self, config: EngineConfig, version: str) -> None:
        """Deploy: switch engine arguments and version for the next step (a drain-free hot swap)."""
        self.config = config
        self.version = version
        self._steady = False
        pool = self.pool
        pool.set_caching(config.enable_prefix_caching)
        pool.total = self._blocks(config)
        while pool.used > pool.total and self.running:
            self._preempt(self.running.pop())
        pool.resize(pool.total)

    # ------------------------------------------------------------------ requests in and out
    def load(self) -> int:
        """Requests in the replica (waiting + running)."""
        return len(self.waiting) + len(self.running)

    def has_work(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self.waiting or self.running)

    def accepts(self, prompt_len: int, max_tokens: int) -> bool:
        """Whether the request passes vLLM's length validation (else HTTP 400)."""
        return (
            prompt_len + max_tokens <= self.max_model_len()
            and -(-(prompt_len + max_tokens) // self.config.block_size) <= self.pool.total
        )

    def submit(self, seq: Seq, now_s: float) -> None:
        """Queue a request that arrived at ``now_s`` (it joins at the next step boundary)."""
        if not self.has_work():
            self.clock = max(self.clock, now_s)
        self.waiting.append(seq)
        self._steady = False

    def abort(self, seq: Seq, now_s: float) -> bool:
        """Cancel a request (client gone); False when it had already finished."""
        if seq.finish_s >= 0:
            return False
        self._steady = False
        if seq in self.running:
            self.running.remove(seq)
            self._release(seq, cache_answer=False)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                return False
        seq.finish_s = max(now_s, self.clock)
        seq.finish_reason = "abort"
        self.stats.request_success["abort"] = self.stats.request_success.get("abort", 0) + 1
        return True

    # ------------------------------------------------------------------ KV bookkeeping
    def _release(self, seq: Seq, cache_answer: bool) -> None:
        pool = self.pool
        for key in seq.held:
            pool.unref(key)
        private = seq.private_blocks
        if cache_answer and private > 0:
            # Generated tokens stay cached: the next turn of the conversation resends them.
            bs = self.config.block_size
            answer = (seq.prompt_len + seq.generated) // bs - seq.prompt_len // bs
            answer = min(answer, private)
            if answer > 0 and pool.cache_released(("answer", seq.key), answer):
                private -= answer
        pool.release(private)
        seq.held = []
        seq.shared_blocks = 0
        seq.private_blocks = 0

    def _preempt(self, seq: Seq) -> None:
        """Preemption by recomputation: free everything, go back to the head of the queue."""
        self._release(seq, cache_answer=False)
        seq.computed = 0
        seq.reg_idx = seq.reg_start = seq.reg_end = 0
        seq.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)

    def _register(self, seq: Seq) -> None:
        """Publish the prompt chunks a request has finished computing to the prefix cache."""
        chain = seq.chain
        bs = self.config.block_size
        while seq.reg_idx < len(chain):
            key, tokens = chain[seq.reg_idx]
            end = seq.reg_start + tokens
            if end > seq.computed:
                return
            blocks = end // bs - seq.reg_start // bs
            if self.pool.register(key, blocks):
                seq.held.append(key)
                seq.shared_blocks += blocks
                seq.private_blocks -= blocks
            seq.reg_idx += 1
            seq.reg_start = end

    def _admit(self, seq: Seq, budget: int) -> int:
        """Try to schedule the head of the queue; returns its new tokens, 0 if it does not fit."""
        pool = self.pool
        bs = self.config.block_size
        num_tokens = seq.prompt_len + seq.generated
        count, hit_tokens = pool.lookup(seq.chain)
        cached = min(hit_tokens // bs, (num_tokens - 1) // bs) * bs
        num_new = num_tokens - cached
        if num_new > budget:
            if not self.config.enable_chunked_prefill:
                return 0
            num_new = budget
        keys = [key for key, _ in seq.chain[:count]]
        shared = sum(pool.acquire(key) for key in keys)
        need = -(-(cached + num_new) // bs) - shared
        if not pool.reserve(need):
            for key in keys:
                pool.unref(key)
            return 0
        seq.held = keys
        seq.shared_blocks = shared
        # A cached chunk can span more blocks than this request needs (its prompt ends inside
        # the chunk); the reference then covers it all and it owns no private block. A negative
        # count would hand back -need blocks nobody took at release, and leaked blocks add up
        # until the queue's head never fits again.
        seq.private_blocks = max(need, 0)
        seq.computed = cached
        seq.reg_idx = count
        seq.reg_start = sum(n for _, n in seq.chain[:count])
        if pool.caching:
            self.stats.prefix_cache_queries += num_tokens
            self.stats.prefix_cache_hits += cached
        if seq.cached_tokens < 0:
            seq.cached_tokens = cached
        return num_new

    # ------------------------------------------------------------------ the step
    def run(self, horizon_s: float) -> None:
        """Execute one step (or a run of identical decode steps ending at the first boundary >= horizon_s)."""
        if self._steady and self._decode_run(horizon_s, first_reserved=False):
            return
        config = self.config
        pool = self.pool
        bs = config.block_size
        running = self.running
        budget = config.max_num_batched_tokens
        sched: list[Seq] = []
        news: list[int] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            num_new = seq.prompt_len + seq.generated - seq.computed
            if num_new > budget:
                if not config.enable_chunked_prefill:
                    i += 1
                    continue
                num_new = budget
            need = -(-(seq.computed + num_new) // bs) - seq.shared_blocks - seq.private_blocks
            while not pool.reserve(need):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                seq.private_blocks += max(need, 0)
                sched.append(seq)
                news.append(num_new)
                budget -= num_new
                i += 1
                continue
            break
        if not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < config.max_num_seqs:
                seq = waiting[0]
                num_new = self._admit(seq, budget)
                if num_new == 0:
                    break
                waiting.popleft()
                if seq.scheduled_s < 0:
                    seq.scheduled_s = self.clock
                    self.stats.queue.observe(self.clock - seq.arrival_s)
                running.append(seq)
                sched.append(seq)
                news.append(num_new)
                budget -= num_new
        if not sched:
            # Nothing fits (cannot happen with validated configs); let time pass rather than spin.
            self.clock = max(self.clock, horizon_s)
            return
        prefill_tokens = decode_seqs = decode_ctx = 0
        for seq, n in zip(sched, news, strict=True):
            if n == 1 and seq.generated > 0:
                decode_seqs += 1
                decode_ctx += seq.computed + 1
            else:
                prefill_tokens += n
        if prefill_tokens == 0 and not preempted and len(sched) == len(running):
            self._decode_run(horizon_s, first_reserved=True)
        else:
            cost = self.profile.cost
            step_s = cost.step_s(prefill_tokens, decode_seqs, decode_ctx, config.prefill_factor, config.decode_factor)
            self._single_step(sched, news, step_s, prefill_tokens + decode_seqs)

    def _single_step(self, sched: list[Seq], news: list[int], step_s: float, step_tokens: int) -> None:
        stats = self.stats
        end = self.clock + step_s
        stats.steps += 1
        stats.busy_s += step_s
        stats.iteration_tokens.observe(step_tokens)
        done: list[Seq] = []
        for seq, n in zip(sched, news, strict=True):
            decoding = n == 1 and seq.generated > 0
            seq.computed += n
            if not decoding:
                stats.prefill_tokens_computed += n
                self._register(seq)
            if seq.computed < seq.prompt_len + seq.generated:
                continue  # prefill chunk, no token yet
            if seq.generated == 0:
                seq.first_token_s = end
                stats.ttft.observe(end - seq.arrival_s)
                stats.prompt_tokens += seq.prompt_len
            else:
                stats.itl.observe(end - seq.last_token_s)
            seq.generated += 1
            seq.last_token_s = end
            stats.generation_tokens += 1
            if seq.generated >= seq.target_out:
                done.append(seq)
        self.clock = end
        for seq in done:
            self._finish(seq, end)

    def _decode_run(self, horizon_s: float, first_reserved: bool) -> bool:
        """Commit ``j`` decode-only steps at once; step k lasts ``first + ramp * (k - 1)``.

        Called when every running request is decoding and nothing can be
        admitted; the run stops at the first finish, before any possible block
        shortage, and at the first step boundary at or after ``horizon_s``.
        ``first_reserved``: the scheduler has already reserved the first
        step's blocks. Without that, a run is only taken when every request's
        growth is sure to fit; otherwise returns False and does nothing (the
        full scheduler then decides who is preempted).
        """
        running = self.running
        config = self.config
        cost = self.profile.cost
        n = len(running)
        bs = config.block_size
        context = 0
        left = running[0].target_out
        for seq in running:
            context += seq.computed + 1
            remaining = seq.target_out - seq.generated
            left = min(left, remaining)
        first = cost.step_s(0, n, context, config.prefill_factor, config.decode_factor)
        ramp = config.decode_factor * cost.context_token_s * n
        kv_room = (self.pool.available() // n) * bs
        # <= 0: the pool can be overdrawn by a block (a shared prefix block pinned after its
        # accounting); the full scheduler then decides who is preempted.
        if kv_room <= 0:
            if not first_reserved:
                self._steady = False
                return False
            kv_room = 1
        limit = max(1, min(left, kv_room))
        gap = horizon_s - self.clock
        if gap <= first:
            steps = 1
        elif ramp <= 0.0:
            steps = math.ceil(gap / first)
        else:
            # smallest j with j*first + ramp*j*(j-1)/2 >= gap
            a, b = ramp / 2, first - ramp / 2
            steps = math.ceil((-b + math.sqrt(b * b + 4 * a * gap)) / (2 * a))
        steps = max(1, min(steps, limit)) if self.merge_decode_steps else 1
        duration = steps * first + ramp * steps * (steps - 1) / 2
        end = self.clock + duration
        stats = self.stats
        stats.steps += steps
        stats.busy_s += duration
        stats.iteration_tokens.observe(n, steps)
        stats.itl.observe_ramp(first, ramp, steps, n)
        stats.generation_tokens += n * steps
        pool = self.pool
        done: list[Seq] = []
        for seq in running:
            seq.computed += steps
            seq.generated += steps
            seq.last_token_s = end
            need = -(-seq.computed // bs) - seq.shared_blocks - seq.private_blocks
            if need > 0:
                if not pool.reserve(need):  # cannot happen: kv_room bounds the growth
                    raise AssertionError("decode run outgrew the KV pool")
                seq.private_blocks += need
            if seq.generated >= seq.target_out:
                done.append(seq)
        self.clock = end
        self._steady = not done
        for seq in done:
            self._finish(seq, end)
        return True

    def _finish(self, seq: Seq, now_s: float) -> None:
        self.running.remove(seq)
        self._release(seq, cache_answer=True)
        seq.finish_s = now_s
        seq.finish_reason = "length" if seq.generated >= seq.max_tokens else "stop"
        stats = self.stats
        stats.e2e.observe(now_s - seq.arrival_s)
        stats.request_success[seq.finish_reason] = stats.request_success.get(seq.finish_reason, 0) + 1
        self.finished.append(seq)
