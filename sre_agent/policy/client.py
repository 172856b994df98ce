"""The policy engine: bounded retries for reasoning-model requests over an injected httpx client.

:class:`PolicyEngine` runs one logical request as a tenacity loop
(``Retrying`` / ``AsyncRetrying``) whose stop, wait and retry strategies read
one :class:`~sre_agent.policy.strategies.AttemptState`. Each attempt reserves
its worst case from the per-request :class:`~sre_agent.policy.budget.Budget`
first (so no path exceeds attempts, tokens, dollars or the deadline), sends
one POST, classifies the answer and emits one OTel span with
``http.request.resend_count``, the outcome class, tokens and cost.

Gateway use::

    engine = PolicyEngine([Target("http://127.0.0.1:8000/v1", "o-mini")], BudgetLimits(deadline_s=30))
    with httpx.Client() as client:
        result = engine.run(client, ChatRequest(({"role": "user", "content": "hi"},)))
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx
from opentelemetry import trace
from tenacity import AsyncRetrying, RetryCallState, Retrying
from tenacity.wait import wait_base

from sre_agent.policy.budget import Budget, BudgetLimits, Reservation, RetryBudget
from sre_agent.policy.ledger import ToolLedger
from sre_agent.policy.outcome import Outcome, OutcomeClass, classify, classify_exception
from sre_agent.policy.recovery import ChatRequest, Plan, RecoveryConfig, RecoveryPlanner, Target
from sre_agent.policy.strategies import (
    AttemptState,
    retry_if_recoverable,
    stop_on_budget_or_fleet,
    wait_full_jitter,
    wait_server_hint,
)
from sre_agent.policy.wire import HttpCall, call_template, input_tokens_bound, stream_accumulator

__all__ = ["AttemptRecord", "PolicyEngine", "PolicyResult", "arun_request", "run_request"]

Tool = Callable[[dict[str, Any]], Any]

_STREAM_FORMATS = frozenset({"openai-chat", "openai-responses", "anthropic"})
#: Formats whose tool calls the engine runs and answers; the conversation stays OpenAI-shaped
#: and the wire translates it (wire.anthropic_messages).
_TOOL_FORMATS = frozenset({"openai-chat", "anthropic"})
# Read off the Enum class once: a member lookup there costs about four global lookups per attempt.
_SUCCESS = OutcomeClass.SUCCESS
_TOOL_ERROR = OutcomeClass.TOOL_ERROR


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt: its number (1-based), the model, the outcome, latency in seconds, hedge or not."""

    number: int
    model: str
    outcome: Outcome
    latency_s: float
    hedge: bool = False


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """The end of one logical request.

    Attributes:
        outcome: the last attempt's outcome, or None when the budget allowed no attempt.
        attempts: every attempt in order (hedges included).
        tokens: tokens charged (unknown spend, e.g. a timed-out attempt, charged at its reservation).
        cost_usd: dollars charged on the same basis.
        elapsed_s: seconds from start to return, on the engine's clock.
        history: the recovery decisions taken, in order.
        messages: the conversation as last sent (tool turns included).
    """

    outcome: Outcome | None
    attempts: tuple[AttemptRecord, ...]
    tokens: int
    cost_usd: float
    elapsed_s: float
    history: tuple[str, ...]
    messages: tuple[dict[str, Any], ...]

    @property
    def usable(self) -> bool:
        """True when the final outcome is a success."""
        return self.outcome is not None and self.outcome.usable


#: What one attempt's HTTP exchange yields: (status, headers, body), or the transport error.
_Sent = tuple[tuple[int, Mapping[str, str], Any] | None, BaseException | None]


@dataclass(slots=True)
class _Prepared:
    number: int
    target: Target
    call: HttpCall
    reservation: Reservation
    stream: bool
    hedge: bool


class _LatencyStats:
    """Recent attempt latencies per model (seconds).

    ``expected`` is an exponentially weighted mean (O(1) per attempt, the per-attempt
    deadline check reads it); ``quantile`` sorts the last ``size`` values and is used
    only where a percentile matters (hedge delay, allocation).
    """

    def __init__(self, size: int = 128, weight: float = 0.2) -> None:
        self._size = size
        self._weight = weight
        self._by_model: dict[str, deque[float]] = {}
        self._mean: dict[str, float] = {}

    def add(self, model: str, latency_s: float) -> None:
        self._by_model.setdefault(model, deque(maxlen=self._size)).append(latency_s)
        mean = self._mean.get(model)
        self._mean[model] = latency_s if mean is None else mean + self._weight * (latency_s - mean)

    def count(self, model: str) -> int:
        return len(self._by_model.get(model, ()))

    def expected(self, model: str, prior: float) -> float:
        return self._mean.get(model, prior)

    def quantile(self, model: str, q: float, prior: float) -> float:
        values = self._by_model.get(model)
        if not values:
            return prior
        ordered = sorted(values)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _json_body(content: bytes) -> Any:
    try:
        return json.loads(content) if content else None
    except ValueError:
        return content.decode("utf-8", "replace")


class PolicyEngine:
    """Bounded retries, fallbacks, tool-call idempotency and hedging for one gateway.

    Args:
        targets: the primary model first, then fallbacks in order.
        limits: per-request budget limits.
        fleet: a process-wide :class:`RetryBudget` shared by engines, or None.
        ledger: tool-call ledger (one per engine by default).
        tools: name -> implementation; when given, tool calls are run through the ledger and fed back
            as a new turn (OpenAI chat format only; other formats return the calls to the caller).
        read_only_tools: names of tools without side effects (may run again).
        verifier: text -> bool; a False verdict turns a success into ``invalid_output``.
        recovery: per-class recovery knobs.
        wait: backoff between same-target retries (default full jitter 0.5 s..8 s); Retry-After wins.
        attempt_timeout_s: per-attempt timeout in seconds (None: only the deadline bounds it).
        hedge_after_s: start a hedge when an attempt is still pending after this many seconds
            (None: latency p95 of the target once 20 attempts were seen; 0, the default, disables).
            Sync runs then send on worker threads; without hedging they send on the calling thread.
        clock / sleep / async_sleep: injectable time sources; tests pass fakes and never sleep.
        tracer: OTel tracer (default: the global one named ``sre_agent.policy``).
    """

    def __init__(
        self,
        targets: Sequence[Target],
        limits: BudgetLimits | None = None,
        *,
        fleet: RetryBudget | None = None,
        ledger: ToolLedger | None = None,
        tools: Mapping[str, Tool] | None = None,
        read_only_tools: frozenset[str] = frozenset(),
        verifier: Callable[[str], bool] | None = None,
        recovery: RecoveryConfig | None = None,
        wait: wait_base | None = None,
        attempt_timeout_s: float | None = None,
        hedge_after_s: float | None = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        async_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tracer: trace.Tracer | None = None,
    ) -> None:
        if not targets:
            raise ValueError("at least one target is required")
        self.targets = tuple(targets)
        self.limits = limits or BudgetLimits()
        self.fleet = fleet
        self.ledger = ledger or ToolLedger()
        self.tools = dict(tools or {})
        self.read_only_tools = read_only_tools
        self.verifier = verifier
        self.planner = RecoveryPlanner(self.targets, recovery)
        self.attempt_timeout_s = attempt_timeout_s
        self.hedge_after_s = hedge_after_s
        self.clock = clock
        self.sleep = sleep
        self.async_sleep = async_sleep
        self.tracer = tracer or trace.get_tracer("sre_agent.policy")
        self.latency = _LatencyStats()
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid()}-{id(self):x}"
        self._stop = stop_on_budget_or_fleet()
        self._wait = wait_server_hint(wait or wait_full_jitter())
        self._retry = retry_if_recoverable()

    # -- shared, pure-ish steps ---------------------------------------------------------------

    def new_state(self, request: ChatRequest, limits: BudgetLimits | None = None) -> AttemptState:
        """A fresh state for ``request`` under ``limits`` (default: the engine's); for benchmarks and custom loops."""
        if request.request_id is None:
            # Scopes the tool ledger; unique within the process is enough (uuid4 costs more).
            request = replace(request, request_id=f"{self._id_prefix}-{next(self._ids)}")
        state = AttemptState(
            Budget(limits or self.limits, self.clock), self.fleet, self.planner, self.targets[0].expected_latency_s
        )
        state.extra["plan"] = Plan(request)
        return state

    def _prepare(self, state: AttemptState, hedge: bool = False) -> _Prepared | None:
        extra = state.extra
        plan: Plan = extra["plan"]
        target = self.targets[plan.target_index]
        request = plan.request
        # The bound serialises the messages: compute it once per distinct request, not per retry.
        cached = extra.get("input_bound")
        if cached is None or cached[0] is not request.messages:
            cached = (request.messages, input_tokens_bound(request))
            extra["input_bound"] = cached
        reservation = state.budget.reserve(cached[1], request.max_output_tokens, target.pricing, self.attempt_timeout_s)
        if reservation is None:
            plan.budget_refused = True
            return None
        if not hedge:  # a hedge duplicates the attempt its decision already started
            plan.started()
        # Retries of one request on one target differ only in the output cap: build URL,
        # headers and body once and fill the cap in per attempt.
        template = extra.get("call_template")
        if template is None or template[0] is not request or template[1] is not target:
            template = (request, target, call_template(target, request))
            extra["call_template"] = template
        call = template[2].call(reservation.max_output_tokens)
        stream = request.stream and target.provider_format in _STREAM_FORMATS
        return _Prepared(state.budget.attempts, target, call, reservation, stream, hedge)

    def _start_span(self, prepared: _Prepared) -> trace.Span:
        return self.tracer.start_span(
            f"chat {prepared.target.model}",
            kind=trace.SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": prepared.call.provider_name,
                "gen_ai.request.model": prepared.target.model,
                "gen_ai.request.max_tokens": prepared.reservation.max_output_tokens,
                "http.request.method": "POST",
                "url.full": prepared.call.url,
                "http.request.resend_count": prepared.number - 1,
                "sre_agent.policy.attempt": prepared.number,
                "sre_agent.policy.hedge": prepared.hedge,
            },
        )

    def _complete(
        self,
        state: AttemptState,
        *,
        prepared: _Prepared,
        span: trace.Span,
        response: tuple[int, Mapping[str, str], Any] | None,
        error: BaseException | None,
        latency_s: float,
    ) -> Outcome:
        target = prepared.target
        if response is None:
            outcome = classify_exception(error or TimeoutError("no response"))
            # A timed-out request may still be billed: charge its worst case. A refused
            # connection never reached the model: charge nothing.
            unknown = outcome.cls is OutcomeClass.TIMEOUT
            state.budget.charge(prepared.reservation, None if unknown else 0, None if unknown else 0.0)
        else:
            status, headers, body = response
            outcome = classify(status, headers, body, provider_format=target.provider_format, pricing=target.pricing)
            reported = outcome.usage.total_tokens > 0
            unknown = status < 400 and not reported  # a 200 without usage was billed somehow
            state.budget.charge(
                prepared.reservation,
                None if unknown else outcome.usage.total_tokens,
                None if unknown else outcome.cost_usd,
            )
            self.latency.add(target.model, latency_s)
            outcome = self._after_answer(state, outcome)
        state.expected_latency_s = self.latency.expected(target.model, target.expected_latency_s)
        state.last = outcome
        state.outcomes.append(outcome)
        state.extra.setdefault("records", []).append(
            AttemptRecord(prepared.number, target.model, outcome, latency_s, prepared.hedge)
        )
        self._end_span(span, outcome)
        return outcome

    def _after_answer(self, state: AttemptState, outcome: Outcome) -> Outcome:
        """Verifier, tool execution through the ledger, and repair turns."""
        plan: Plan = state.extra["plan"]
        plan.pending_tool_turn = False
        cls = outcome.cls
        if cls is _TOOL_ERROR:
            note = "Your last tool call had malformed JSON arguments. Call the tool again with valid JSON."
            plan.request = _append(plan.request, {"role": "user", "content": note})
            return outcome
        if cls is not _SUCCESS:
            return outcome
        runs_tools = self.tools and self.targets[plan.target_index].provider_format in _TOOL_FORMATS
        if outcome.tool_calls and runs_tools:
            messages: list[dict[str, Any]] = [
                {
                    "role": "assistant",
                    "content": outcome.text or None,
                    "tool_calls": [
                        {
                            "id": c.call_id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                        }
                        for c in outcome.tool_calls
                    ],
                }
            ]
            failed = False
            scope = plan.request.request_id or ""
            for call in outcome.tool_calls:
                tool = self.tools.get(call.name)
                if tool is None:
                    content: Any = {"error": f"unknown tool {call.name!r}"}
                    failed = True
                else:
                    entry = self.ledger.execute(scope, call, tool, call.name not in self.read_only_tools)
                    content = {"error": entry.error} if entry.error else entry.result
                    failed = failed or entry.error is not None
                messages.append({"role": "tool", "tool_call_id": call.call_id, "content": json.dumps(content)})
            plan.request = _append(plan.request, *messages)
            if failed:
                return replace(outcome, cls=OutcomeClass.TOOL_ERROR, detail="a tool failed; asking the model to repair")
            plan.pending_tool_turn = True
            return outcome
        if self.verifier is not None and not outcome.tool_calls and not self.verifier(outcome.text):
            return replace(outcome, cls=OutcomeClass.INVALID_OUTPUT, detail="verifier rejected the answer")
        return outcome

    @staticmethod
    def _end_span(span: trace.Span, outcome: Outcome, cancelled: bool = False) -> None:
        usage = outcome.usage
        span.set_attributes(
            {
                "sre_agent.policy.outcome": outcome.cls.value,
                "sre_agent.policy.cost_usd": outcome.cost_usd,
                "gen_ai.usage.input_tokens": usage.input_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
                "gen_ai.usage.reasoning_tokens": usage.reasoning_tokens,
                "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
                "sre_agent.policy.cancelled": cancelled,
            }
        )
        if outcome.status_code is not None:
            span.set_attribute("http.response.status_code", outcome.status_code)
        if outcome.finish_reason is not None:
            span.set_attribute("gen_ai.response.finish_reasons", [outcome.finish_reason])
        if not outcome.usable:
            span.set_attribute("error.type", outcome.cls.value)
            span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.detail))
        span.end()

    def _refused_by_budget(self, state: AttemptState) -> Outcome:
        last = state.last
        detail = "budget allows no further attempt"
        return (
            replace(last, detail=f"{last.detail}; {detail}")
            if last is not None
            else Outcome(OutcomeClass.CLIENT_ERROR, detail=detail)
        )

    def _result(self, state: AttemptState) -> PolicyResult:
        plan: Plan = state.extra["plan"]
        plan.finished()
        budget = state.budget
        return PolicyResult(
            outcome=state.last,
            attempts=tuple(state.extra.get("records", [])),
            tokens=budget.tokens,
            cost_usd=budget.usd,
            elapsed_s=budget.elapsed_s(),
            history=tuple(plan.history),
            messages=plan.request.messages,
        )

    @staticmethod
    def _give_up(retry_state: RetryCallState) -> Any:
        future = retry_state.outcome
        return None if future is None else future.result()

    # -- sync ---------------------------------------------------------------------------------

    def run(self, client: httpx.Client, request: ChatRequest, limits: BudgetLimits | None = None) -> PolicyResult:
        """Run ``request`` to a usable answer or until a budget or the recovery rules stop it.

        ``limits`` overrides the engine's budget for this request (e.g. a tighter deadline).
        """
        state = self.new_state(request, limits)
        if self.fleet is not None:
            self.fleet.deposit()
        retrying = Retrying(
            stop=self._stop,
            wait=self._wait,
            retry=self._retry,
            sleep=self.sleep,
            retry_error_callback=self._give_up,
        )
        with self.tracer.start_as_current_span("policy.request"):
            retrying(self._attempt_sync, state, client)
        return self._result(state)

    def _attempt_sync(self, state: AttemptState, client: httpx.Client) -> Outcome:
        prepared = self._prepare(state)
        if prepared is None:
            return self._refused_by_budget(state)
        span = self._start_span(prepared)
        started = self.clock()
        delay = self._hedge_delay(prepared.target.model)
        if delay is None:  # no hedging: the request runs on the calling thread
            response, error = self._send_sync(client, prepared, started)
        else:
            cancel = threading.Event()
            first = _in_thread(self._send_sync, client, prepared, started, cancel)
            done, _ = concurrent.futures.wait([first], timeout=delay)
            if not done:
                return self._race_hedge_sync(state, client, (prepared, span, started, first, cancel))
            response, error = first.result()
        return self._complete(
            state, prepared=prepared, span=span, response=response, error=error, latency_s=self.clock() - started
        )

    def _send_sync(
        self, client: httpx.Client, prepared: _Prepared, started: float, cancel: threading.Event | None = None
    ) -> _Sent:
        """The attempt's HTTP exchange, nothing else (it may run on a hedge thread)."""
        timeout = prepared.reservation.timeout_s

        def check(request: httpx.Request) -> None:
            # httpx bounds each read, not the whole attempt: a server trickling its answer, streamed
            # or not, must not outlive the attempt's share of the deadline (by more than one read).
            if timeout is not None and self.clock() - started > timeout:
                raise httpx.ReadTimeout("attempt exceeded its time budget", request=request)
            if cancel is not None and cancel.is_set():
                raise httpx.ReadError("hedge lost", request=request)

        try:
            call = prepared.call
            with client.stream("POST", call.url, json=call.body, headers=call.headers, timeout=timeout) as resp:
                check(resp.request)
                if prepared.stream and resp.status_code < 400:
                    sse = stream_accumulator(prepared.target.provider_format)
                    for line in resp.iter_lines():
                        sse.feed_line(line)
                        check(resp.request)
                    return (resp.status_code, resp.headers, sse.body()), None
                pieces = []
                for piece in resp.iter_bytes():
                    pieces.append(piece)
                    check(resp.request)
                return (resp.status_code, resp.headers, _json_body(b"".join(pieces))), None
        except httpx.HTTPError as exc:
            return None, exc

    def _race_hedge_sync(
        self,
        state: AttemptState,
        client: httpx.Client,
        first: tuple[_Prepared, trace.Span, float, concurrent.futures.Future[_Sent], threading.Event],
    ) -> Outcome:
        """:meth:`_race_hedge` on threads: the calling thread classifies, the hedge threads only send."""
        prepared, span, started, future, _ = first
        hedge = self._hedge(state)
        if hedge is None:
            response, error = future.result()
            return self._complete(
                state, prepared=prepared, span=span, response=response, error=error, latency_s=self.clock() - started
            )
        hedge_span, hedge_started, cancel = self._start_span(hedge), self.clock(), threading.Event()
        second = _in_thread(self._send_sync, client, hedge, hedge_started, cancel)
        pending = {future: first, second: (hedge, hedge_span, hedge_started, second, cancel)}
        outcome: Outcome | None = None
        while pending and (outcome is None or not outcome.usable):
            done, _ = concurrent.futures.wait(list(pending), return_when=concurrent.futures.FIRST_COMPLETED)
            for finished in done:
                item, item_span, item_started, _, _ = pending.pop(finished)
                response, error = finished.result()
                latency_s = self.clock() - item_started
                outcome = self._complete(
                    state, prepared=item, span=item_span, response=response, error=error, latency_s=latency_s
                )
                if outcome.usable:
                    break
        for item, item_span, _, _, item_cancel in pending.values():
            item_cancel.set()  # it stops at its next read; the thread is a daemon and holds no state
            self._abandon(state, item, item_span)
        assert outcome is not None
        return outcome

    def _hedge(self, state: AttemptState) -> _Prepared | None:
        """The hedge attempt, if the fleet budget and the request's budget pay for one."""
        fleet_ok = self.fleet is None or self.fleet.try_withdraw()
        hedge = self._prepare(state, hedge=True) if fleet_ok else None
        if hedge is None:
            state.extra["plan"].budget_refused = False  # a refused hedge must not end the request
        return hedge

    def _abandon(self, state: AttemptState, prepared: _Prepared, span: trace.Span) -> None:
        """Settle a hedge race's loser: its tokens may be billed, so it is charged its reservation."""
        state.budget.charge(prepared.reservation, None, None)
        self._end_span(span, Outcome(OutcomeClass.TIMEOUT, detail="hedge lost"), cancelled=True)

    # -- async --------------------------------------------------------------------------------

    async def arun(
        self, client: httpx.AsyncClient, request: ChatRequest, limits: BudgetLimits | None = None
    ) -> PolicyResult:
        """Async :meth:`run`; the whole attempt (not only each read) is bounded by its timeout."""
        state = self.new_state(request, limits)
        if self.fleet is not None:
            self.fleet.deposit()
        retrying = AsyncRetrying(
            stop=self._stop,
            wait=self._wait,
            retry=self._retry,
            sleep=self.async_sleep,
            retry_error_callback=self._give_up,
        )
        with self.tracer.start_as_current_span("policy.request"):
            await retrying(self._attempt_async, state, client)
        return self._result(state)

    async def _send_async(self, client: httpx.AsyncClient, prepared: _Prepared) -> _Sent:
        call = prepared.call
        timeout = prepared.reservation.timeout_s
        try:
            async with asyncio.timeout(timeout):
                if prepared.stream:
                    async with client.stream("POST", call.url, json=call.body, headers=call.headers) as resp:
                        if resp.status_code >= 400:
                            return (resp.status_code, resp.headers, _json_body(await resp.aread())), None
                        sse = stream_accumulator(prepared.target.provider_format)
                        async for line in resp.aiter_lines():
                            sse.feed_line(line)
                        return (resp.status_code, resp.headers, sse.body()), None
                resp = await client.post(call.url, json=call.body, headers=call.headers, timeout=timeout)
                return (resp.status_code, resp.headers, _json_body(resp.content)), None
        except TimeoutError as exc:
            return None, httpx.TimeoutException(f"attempt exceeded {timeout}s") if timeout else exc
        except httpx.HTTPError as exc:
            return None, exc

    def _hedge_delay(self, model: str) -> float | None:
        if self.hedge_after_s is not None:
            return self.hedge_after_s if self.hedge_after_s > 0 else None
        return self.latency.quantile(model, 0.95, 0.0) if self.latency.count(model) >= 20 else None

    async def _attempt_async(self, state: AttemptState, client: httpx.AsyncClient) -> Outcome:
        prepared = self._prepare(state)
        if prepared is None:
            return self._refused_by_budget(state)
        span = self._start_span(prepared)
        started = self.clock()
        first = asyncio.create_task(self._send_async(client, prepared))
        delay = self._hedge_delay(prepared.target.model)
        if delay is not None:
            done, _ = await asyncio.wait({first}, timeout=delay)
            if not done:
                return await self._race_hedge(
                    state, client=client, prepared=prepared, span=span, started=started, first=first
                )
        response, error = await first
        return self._complete(
            state, prepared=prepared, span=span, response=response, error=error, latency_s=self.clock() - started
        )

    async def _race_hedge(
        self,
        state: AttemptState,
        *,
        client: httpx.AsyncClient,
        prepared: _Prepared,
        span: trace.Span,
        started: float,
        first: asyncio.Task[_Sent],
    ) -> Outcome:
        """Start a hedge (charged to the fleet budget and to spend) and keep the first usable answer."""
        hedge = self._hedge(state)
        if hedge is None:
            response, error = await first
            return self._complete(
                state, prepared=prepared, span=span, response=response, error=error, latency_s=self.clock() - started
            )
        hedge_span = self._start_span(hedge)
        hedge_started = self.clock()
        second = asyncio.create_task(self._send_async(client, hedge))
        pending = {first: (prepared, span, started), second: (hedge, hedge_span, hedge_started)}
        outcome: Outcome | None = None
        while pending:
            done, _ = await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                item, item_span, item_started = pending.pop(task)
                response, error = task.result()
                outcome = self._complete(
                    state,
                    prepared=item,
                    span=item_span,
                    response=response,
                    error=error,
                    latency_s=self.clock() - item_started,
                )
                if outcome.usable:
                    break
            if outcome is not None and outcome.usable:
                break
        for task, (item, item_span, _) in pending.items():
            task.cancel()
            self._abandon(state, item, item_span)
        assert outcome is not None
        return outcome


def _in_thread(fn: Callable[..., _Sent], *args: Any) -> concurrent.futures.Future[_Sent]:
    """Run ``fn(*args)`` on a new daemon thread. A hedge lost mid-read may block its thread until
    its own timeout; a pool would let such threads hold up the next request's attempts."""
    future: concurrent.futures.Future[_Sent] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # boundary: the caller re-raises it from result()
            future.set_exception(exc)

    threading.Thread(target=run, name="sre-agent-policy-attempt", daemon=True).start()
    return future


def _append(request: ChatRequest, *messages: dict[str, Any]) -> ChatRequest:
    return replace(request, messages=(*request.messages, *messages))


def run_request(
    client: httpx.Client, target: Target, request: ChatRequest, limits: BudgetLimits | None = None, **options: Any
) -> PolicyResult:
    """One-shot sync entry point: ``PolicyEngine([target], limits, **options).run(client, request)``."""
    return PolicyEngine([target], limits, **options).run(client, request)


async def arun_request(
    client: httpx.AsyncClient, target: Target, request: ChatRequest, limits: BudgetLimits | None = None, **options: Any
) -> PolicyResult:
    """One-shot async entry point: ``await PolicyEngine([target], limits, **options).arun(client, request)``."""
    return await PolicyEngine([target], limits, **options).arun(client, request)
