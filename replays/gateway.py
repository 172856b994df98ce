"""The gateway in front of the replicas, and the discrete-event loop that drives everything.

Per logical request the gateway: runs the route's dependency calls in order
(retrieval, guardrail, tokenizer; each with its own latency distribution,
which a scenario may change per tenant), picks a replica (routing policy),
sends the request, and on failure or timeout retries under its retry policy
(exponential backoff with full jitter). A timed-out attempt is cancelled at
the engine, which frees its KV blocks (vLLM emits no ``llm_request`` span for
aborted requests).

The loop keeps one heap of gateway events (arrivals, dispatches, responses,
timeouts, deploys, metric ticks) and advances the replica with the earliest
clock until it passes the next gateway event; so every replica sees its
requests at the step boundary where a real one would. Everything random
draws from one seeded ``random.Random``: a replay is a pure function of its
inputs.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sre_agent.replays.engine import EngineConfig, Replica, Seq
from sre_agent.replays.workload import WorkloadRequest

__all__ = [
    "Attempt",
    "DependencyCall",
    "Fault",
    "GatewayConfig",
    "LatencyDist",
    "RequestRecord",
    "RetryPolicy",
    "Simulation",
    "TelemetrySink",
]

METRIC_INTERVAL_S = 5.0
# Routing sees replica state at most this old (seconds); real gateways route on metrics
# scraped every 50 ms to 1 s (e.g. the Gateway API inference extension's endpoint picker).
ROUTING_STALENESS_S = 0.2


@dataclass(frozen=True)
class LatencyDist:
    """Log-normal latency: ``median_s * exp(sigma * N(0, 1))`` seconds."""

    median_s: float
    sigma: float = 0.3

    def sample(self, rng: random.Random) -> float:
        """One draw, seconds."""
        return self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))


@dataclass(frozen=True)
class RetryPolicy:
    """Gateway retry policy for engine attempts.

    Attributes:
        max_attempts: attempts per logical request, first one included (1 = no retries).
        attempt_timeout_s: give up on an attempt after this long (``None`` = wait forever).
        backoff_base_s / backoff_max_s: full-jitter exponential backoff bounds, seconds.
        retry_on: ``error.type`` values that are retried (HTTP status as a string, or ``timeout``).
    """

    max_attempts: int = 1
    attempt_timeout_s: float | None = None
    backoff_base_s: float = 0.1
    backoff_max_s: float = 2.0
    retry_on: tuple[str, ...] = ("timeout", "500", "502", "503")


@dataclass(frozen=True)
class Fault:
    """Error injection: between ``start_s`` and ``end_s`` the engine answers ``status`` to a share of requests."""

    error_rate: float
    status: int = 500
    replica: str | None = None
    start_s: float = 0.0
    end_s: float = math.inf


@dataclass
class GatewayConfig:
    """Routing, dependencies and retries of the gateway (``service.name = "llm-gateway"``)."""

    version: str = "gw-1"
    routing: str = "least_loaded"
    dependencies: dict[str, LatencyDist] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    overhead_s: float = 0.001
    network_s: float = 0.0005


@dataclass(slots=True)
class DependencyCall:
    """One dependency span: name and simulated start/end seconds."""

    name: str
    start_s: float
    end_s: float


@dataclass(slots=True)
class Attempt:
    """One engine call of a logical request.

    ``seq`` is the engine-side request (``None`` when the engine rejected it
    before scheduling); ``status`` is ``ok``, ``error`` or ``timeout``.
    """

    index: int
    replica: str
    engine_version: str
    start_s: float
    end_s: float = -1.0
    status: str = "pending"
    error_type: str | None = None
    http_status: int | None = None
    seq: Seq | None = None


@dataclass(slots=True)
class RequestRecord:
    """Everything the telemetry of one logical request is built from (seconds of simulated time)."""

    req: WorkloadRequest
    model: str
    gateway_version: str
    start_s: float
    end_s: float = -1.0
    deps: list[DependencyCall] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    status: str = "pending"
    error_type: str | None = None

    @property
    def engine_spans(self) -> list[Attempt]:
        """Attempts for which the engine emits an ``llm_request`` span (finished, not aborted)."""
        return [
            a for a in self.attempts if a.seq is not None and a.seq.finish_s >= 0 and a.seq.finish_reason != "abort"
        ]


class TelemetrySink(Protocol):
    """Receives the replay's telemetry as it happens (see ``replays.telemetry``)."""

    def on_request(self, record: RequestRecord) -> None:
        """A logical request completed (successfully or not)."""

    def on_metrics(self, time_s: float, replicas: Sequence[Replica]) -> None:
        """A 5-second metric scrape of every replica."""


ChangeFn = Callable[["Simulation"], None]


class Simulation:
    """Replicas behind a gateway, driven by a workload; call :meth:`run`.

    Attributes:
        records: completed logical requests in completion order.
        replicas: the engine replicas, by position.
    """

    def __init__(
        self,
        workload: Sequence[WorkloadRequest],
        replicas: Sequence[Replica],
        gateway: GatewayConfig,
        routes: dict[str, tuple[str, ...]],
        *,
        seed: int,
        sink: TelemetrySink | None = None,
        changes: Sequence[tuple[float, ChangeFn]] = (),
        faults: Sequence[Fault] = (),
        metric_interval_s: float = METRIC_INTERVAL_S,
    ) -> None:
        self.workload = workload
        self.replicas = list(replicas)
        self.gateway = gateway
        self.routes = routes
        self.rng = random.Random(seed)
        self.sink = sink
        self.faults = list(faults)
        self.dependency_overrides: dict[tuple[str, str | None], LatencyDist] = {}
        self.records: list[RequestRecord] = []
        self.metric_interval_s = metric_interval_s
        self._heap: list[tuple[float, int, str, object]] = []
        self._order = itertools.count()
        self._rr = 0
        self._pending = 0
        self._seq_owner: dict[int, tuple[RequestRecord, Attempt]] = {}
        self._attempt_owner: dict[int, RequestRecord] = {}
        for at_s, change in changes:
            self._push(at_s, "change", change)

    # ------------------------------------------------------------------ helpers
    def _push(self, time_s: float, kind: str, payload: object) -> None:
        heapq.heappush(self._heap, (time_s, next(self._order), kind, payload))

    def replica(self, name: str) -> Replica:
        """The replica whose ``host.name`` is ``name``."""
        for r in self.replicas:
            if r.name == name:
                return r
        raise KeyError(name)

    def deploy_engine(self, names: Sequence[str] | None, config: EngineConfig, version: str) -> None:
        """Switch the named replicas (all when ``None``) to ``config`` and ``version``."""
        for r in self.replicas:
            if names is None or r.name in names:
                r.reconfigure(config, version)

    def _dependency(self, name: str, tenant: str) -> LatencyDist:
        dist = self.dependency_overrides.get((name, tenant)) or self.dependency_overrides.get((name, None))
        return dist or self.gateway.dependencies[name]

    def _route(self, record: RequestRecord) -> Replica:
        candidates = [r for r in self.replicas if r.routable]
        policy = self.gateway.routing
        self._rr += 1
        if policy == "round_robin":
            return candidates[self._rr % len(candidates)]
        if policy == "random":
            return candidates[self.rng.randrange(len(candidates))]
        if policy == "prefix_affinity":
            # crc32 of the first chunk's key: stable across processes (hash() of a str is salted)
            home = candidates[zlib.crc32(repr(record.req.chain[0][0]).encode()) % len(candidates)]
            lightest = min(candidates, key=Replica.load)
            return home if home.load() <= 2 * lightest.load() + 4 else lightest
        # least_loaded, ties broken round-robin so that idle replicas share the work
        n = len(candidates)
        return min((candidates[(self._rr + i) % n] for i in range(n)), key=Replica.load)

    # ------------------------------------------------------------------ event handlers
    def _arrive(self, req: WorkloadRequest) -> None:
        model = self.replicas[0].profile.model
        record = RequestRecord(req, model, self.gateway.version, req.arrival_s)
        t = req.arrival_s + self.gateway.overhead_s
        for name in self.routes.get(req.route, ()):
            latency = self._dependency(name, req.tenant).sample(self.rng)
            record.deps.append(DependencyCall(name, t, t + latency))
            t += latency
        self._pending += 1
        self._push(t, "dispatch", record)

    def _dispatch(self, now: float, record: RequestRecord) -> None:
        for r in self.replicas:
            if r.clock < now - ROUTING_STALENESS_S:
                self._advance(r, now)
        replica = self._route(record)
        req = record.req
        attempt = Attempt(len(record.attempts), replica.name, replica.version, now)
        record.attempts.append(attempt)
        self._attempt_owner[id(attempt)] = record
        arrive = now + self.gateway.network_s
        for fault in self.faults:
            if (
                (fault.replica is None or fault.replica == replica.name)
                and fault.start_s <= now < fault.end_s
                and self.rng.random() < fault.error_rate
            ):
                self._fail(attempt, arrive + LatencyDist(0.02, 0.5).sample(self.rng), fault.status)
                return
        if not replica.accepts(req.input_tokens, req.max_tokens):
            self._fail(attempt, arrive + 0.002, 400)
            return
        seq = Seq(
            req.request_id, req.chain, req.input_tokens, req.output_tokens, max_tokens=req.max_tokens, arrival_s=arrive
        )
        attempt.seq = seq
        self._advance(replica, arrive)
        replica.submit(seq, arrive)
        timeout = self.gateway.retry.attempt_timeout_s
        if timeout is not None:
            self._push(now + timeout, "timeout", (record, attempt, replica))
        self._seq_owner[id(seq)] = (record, attempt)

    def _fail(self, attempt: Attempt, at_s: float, status: int) -> None:
        attempt.status = "error"
        attempt.http_status = status
        attempt.error_type = str(status)
        attempt.end_s = at_s
        # the response reaches the gateway at at_s + network
        self._push(at_s + self.gateway.network_s, "response", attempt)

    def _timeout(self, now: float, payload: tuple[RequestRecord, Attempt, Replica]) -> None:
        record, attempt, replica = payload
        if attempt.status != "pending":
            return
        assert attempt.seq is not None
        self._advance(replica, now)
        replica.abort(attempt.seq, now)
        self._seq_owner.pop(id(attempt.seq), None)
        self._attempt_owner.pop(id(attempt), None)
        attempt.status = "timeout"
        attempt.error_type = "timeout"
        attempt.end_s = now
        self._after_attempt(now, record, attempt)

    def _response(self, now: float, attempt: Attempt) -> None:
        record = self._attempt_owner.pop(id(attempt), None)
        if record is None:
            return  # the gateway already gave up on it (timeout)
        if attempt.status == "pending":
            attempt.status = "ok"
            attempt.http_status = 200
            attempt.end_s = now
        self._after_attempt(now, record, attempt)

    def _after_attempt(self, now: float, record: RequestRecord, attempt: Attempt) -> None:
        policy = self.gateway.retry
        if (
            attempt.status != "ok"
            and attempt.index + 1 < policy.max_attempts
            and (attempt.error_type or "") in policy.retry_on
        ):
            cap = min(policy.backoff_max_s, policy.backoff_base_s * 2**attempt.index)
            self._push(now + self.rng.uniform(0.0, cap), "dispatch", record)
            return
        record.status = "ok" if attempt.status == "ok" else "error"
        record.error_type = attempt.error_type
        record.end_s = now + self.gateway.overhead_s
        self._pending -= 1
        self.records.append(record)
        if self.sink is not None:
            self.sink.on_request(record)

    # ------------------------------------------------------------------ the loop
    def _advance(self, replica: Replica, until_s: float) -> None:
        """Run a replica until its clock reaches ``until_s`` (or it runs out of work).

        Replicas are advanced lazily: only when a request is sent to one, a
        request on it is cancelled, it is reconfigured, or it is scraped. A
        request thus joins at the first step boundary after it arrives, as in
        vLLM. Routing reads the other replicas' state as of their last step
        before the dispatch, which is fresher than the scraped metrics real
        gateways route on.
        """
        while (replica.waiting or replica.running) and replica.clock < until_s:
            replica.run(until_s)
            if replica.finished:
                for seq in replica.finished:
                    owner = self._seq_owner.pop(id(seq), None)
                    if owner is not None:
                        self._push(seq.finish_s + self.gateway.network_s, "response", owner[1])
                replica.finished.clear()

    def run(self) -> list[RequestRecord]:
        """Replay the whole workload and drain; returns the completed requests."""
        for req in self.workload:
            self._push(req.arrival_s, "arrive", req)
        end_of_arrivals = self.workload[-1].arrival_s if self.workload else 0.0
        self._push(0.0, "tick", None)
        heap = self._heap
        replicas = self.replicas
        while heap:
            now, _, kind, payload = heapq.heappop(heap)
            if kind in ("change", "tick"):
                for r in replicas:
                    self._advance(r, now)
            if kind == "arrive":
                self._arrive(payload)  # type: ignore[arg-type]
            elif kind == "dispatch":
                self._dispatch(now, payload)  # type: ignore[arg-type]
            elif kind == "response":
                self._response(now, payload)  # type: ignore[arg-type]
            elif kind == "timeout":
                self._timeout(now, payload)  # type: ignore[arg-type]
            elif kind == "change":
                payload(self)  # type: ignore[operator]
            elif kind == "tick":
                if self.sink is not None:
                    self.sink.on_metrics(now, replicas)
                if now < end_of_arrivals or self._pending > 0 or any(r.has_work() for r in replicas):
                    self._push(now + self.metric_interval_s, "tick", None)
        return self.records
