"""Telemetry of a replay: OpenTelemetry SDK spans and metrics with simulated timestamps.

Spans are the SDK's own finished-span type (``ReadableSpan``) with ids from a
seeded ``IdGenerator``, so the real SDK exporters (OTLP HTTP and gRPC) send
them unchanged. They are built finished rather than through
``Tracer.start_span``/``end``: the timestamps are simulated anyway, and
building them directly costs about a tenth as much (140 us per span for
``start_span`` on the 2-core CI machine), which is what lets the simulator run
100x faster than real time with its telemetry.

Per logical request (one trace):

- gateway ``SERVER`` span ``POST {route}`` (``service.name = llm-gateway``),
  with ``tenant.id``, ``http.route``, ``gen_ai.request.model``;
- one ``CLIENT`` span per dependency call (retrieval, guardrail, ...);
- one ``CLIENT`` span ``POST`` per engine attempt, ``http.request.resend_count`` on
  retries (semconv: absent on the first attempt);
- the engine's ``llm_request`` ``SERVER`` span (scope ``vllm.llm_engine``,
  ``service.name = vllm``, ``host.name`` = the replica) as the child of its
  attempt, with the V1 attribute set (or V0), exactly as
  ``vllm/v1/engine/output_processor.py`` fills it; or, with the ``sglang``
  set, SGLang 0.5's root span ``" Req {rid[:8]}"`` (INTERNAL, scope
  ``sglang server``, ``service.name = sglang``) with the attributes
  ``tokenizer_manager.py`` writes at completion (no queue time, finish
  reasons as a JSON string). Its thread and stage child spans are not built.

Metrics, per replica every scrape interval, are what an OTel Collector's
prometheus receiver delivers for vLLM's ``/metrics``: counters as cumulative
monotonic sums named with ``_total``, gauges, and cumulative explicit-bucket
histograms with vLLM's buckets. The SDK's metric readers stamp points with the
wall clock, so the points are built directly as SDK ``MetricsData`` (the type
the SDK exporters take) with simulated timestamps. With the ``sglang`` set the
same statistics go out under SGLang's names (``sglang:num_running_reqs``,
``sglang:cached_tokens_total``, ``sglang:cache_hit_rate`` over the scrape
interval, ...); the histograms keep vLLM's bucket bounds.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from sre_agent.replays.engine import Replica
from sre_agent.replays.gateway import Attempt, RequestRecord
from sre_agent.replays.outputs import TelemetryOutput
from sre_agent.replays.stats import Histogram as EngineHistogram
from sre_agent.replays.stats import ReplicaStats

__all__ = [
    "ATTRIBUTE_SETS",
    "ENGINE_SCOPE",
    "ENGINE_SERVICE",
    "GATEWAY_SERVICE",
    "PROMETHEUS_SCOPE",
    "SGLANG_SCOPE",
    "SGLANG_SERVICE",
    "MetricBuilder",
    "SeededIdGenerator",
    "SpanBuilder",
    "TelemetryEmitter",
]

GATEWAY_SERVICE = "llm-gateway"
ENGINE_SERVICE = "vllm"
ENGINE_SCOPE = "vllm.llm_engine"
SGLANG_SERVICE = "sglang"
SGLANG_SCOPE = "sglang server"
#: The engine telemetry shapes a replay can emit.
ATTRIBUTE_SETS = ("v1", "v0", "sglang")
GATEWAY_SCOPE = "llm-gateway"
PROMETHEUS_SCOPE = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
_NS = 1_000_000_000
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_ERROR = Status(StatusCode.ERROR)
_UNSET = Status(StatusCode.UNSET)


class SeededIdGenerator(IdGenerator):
    """Trace and span ids from a seeded PRNG, so a replay is byte-for-byte reproducible."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def generate_span_id(self) -> int:
        """A non-zero 64-bit span id."""
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        """A non-zero 128-bit trace id."""
        return self._rng.getrandbits(128) or 1


class _Scopes:
    """Instrumentation scopes, created once."""

    engine = InstrumentationScope(ENGINE_SCOPE)
    sglang = InstrumentationScope(SGLANG_SCOPE)
    gateway = InstrumentationScope(GATEWAY_SCOPE)
    prometheus = InstrumentationScope(PROMETHEUS_SCOPE)


SCOPES = _Scopes()


class _Resources:
    """One ``Resource`` per (service, version, host), created once."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str, str], Resource] = {}

    def get(self, service: str, version: str, host: str) -> Resource:
        key = (service, version, host)
        res = self._cache.get(key)
        if res is None:
            res = Resource(
                {
                    "service.name": service,
                    "service.version": version,
                    "host.name": host,
                    "service.instance.id": host,
                    "telemetry.sdk.language": "python",
                    "telemetry.sdk.name": "opentelemetry",
                }
            )
            self._cache[key] = res
        return res


class SpanBuilder:
    """Turns a :class:`RequestRecord` into its trace (a list of SDK ``ReadableSpan``).

    Attributes:
        epoch_ns: Unix time in ns of simulated time 0.
        attribute_set: ``"v1"`` (vLLM >= 0.10), ``"v0"`` (the V0 engine) or ``"sglang"`` (SGLang 0.5).
    """

    def __init__(self, epoch_ns: int, seed: int, attribute_set: str = "v1", gateway_host: str = "gateway-1") -> None:
        if attribute_set not in ATTRIBUTE_SETS:
            raise ValueError(f"attribute_set must be one of {', '.join(ATTRIBUTE_SETS)}, not {attribute_set!r}")
        self.epoch_ns = epoch_ns
        self.attribute_set = attribute_set
        self.ids = SeededIdGenerator(seed)
        self.resources = _Resources()
        self.gateway_host = gateway_host

    def _ns(self, t_s: float) -> int:
        return self.epoch_ns + round(t_s * _NS)

    def build(self, record: RequestRecord) -> list[ReadableSpan]:
        """All spans of one logical request, parents before children."""
        ids = self.ids
        trace_id = ids.generate_trace_id()
        req = record.req
        gw_res = self.resources.get(GATEWAY_SERVICE, record.gateway_version, self.gateway_host)
        root_ctx = SpanContext(trace_id, ids.generate_span_id(), False, _SAMPLED)
        root_attrs: dict[str, str | int | float] = {
            "http.request.method": "POST",
            "http.route": req.route,
            "tenant.id": req.tenant,
            "gen_ai.request.model": record.model,
        }
        last = record.attempts[-1] if record.attempts else None
        status_code = _http_status(last)
        root_attrs["http.response.status_code"] = status_code
        if record.status != "ok":
            root_attrs["error.type"] = record.error_type or str(status_code)
        spans = [
            ReadableSpan(
                name=f"POST {req.route}",
                context=root_ctx,
                resource=gw_res,
                attributes=root_attrs,
                kind=SpanKind.SERVER,
                instrumentation_scope=SCOPES.gateway,
                status=_UNSET if record.status == "ok" else _ERROR,
                start_time=self._ns(record.start_s),
                end_time=self._ns(record.end_s),
            )
        ]
        for dep in record.deps:
            spans.append(
                ReadableSpan(
                    name=dep.name,
                    context=SpanContext(trace_id, ids.generate_span_id(), False, _SAMPLED),
                    parent=root_ctx,
                    resource=gw_res,
                    attributes={"peer.service": dep.name, "server.address": f"{dep.name}.svc", "tenant.id": req.tenant},
                    kind=SpanKind.CLIENT,
                    instrumentation_scope=SCOPES.gateway,
                    start_time=self._ns(dep.start_s),
                    end_time=self._ns(dep.end_s),
                )
            )
        for attempt in record.attempts:
            spans.extend(self._attempt_spans(record, attempt, trace_id, root_ctx, gw_res))
        return spans

    def _attempt_spans(
        self, record: RequestRecord, attempt: Attempt, trace_id: int, root_ctx: SpanContext, gw_res: Resource
    ) -> list[ReadableSpan]:
        ctx = SpanContext(trace_id, self.ids.generate_span_id(), False, _SAMPLED)
        attrs: dict[str, str | int | float] = {
            "http.request.method": "POST",
            "server.address": attempt.replica,
            "server.port": 8000,
            "url.full": f"http://{attempt.replica}:8000/v1/chat/completions",
            "gen_ai.request.model": record.model,
        }
        if attempt.index > 0:
            attrs["http.request.resend_count"] = attempt.index
        if attempt.http_status is not None:
            attrs["http.response.status_code"] = attempt.http_status
        if attempt.status != "ok":
            attrs["error.type"] = attempt.error_type or "error"
        out = [
            ReadableSpan(
                # HTTP client semconv: "{method}" when no low-cardinality url template is known
                name="POST",
                context=ctx,
                parent=root_ctx,
                resource=gw_res,
                attributes=attrs,
                kind=SpanKind.CLIENT,
                instrumentation_scope=SCOPES.gateway,
                status=_UNSET if attempt.status == "ok" else _ERROR,
                start_time=self._ns(attempt.start_s),
                end_time=self._ns(attempt.end_s),
            )
        ]
        seq = attempt.seq
        if seq is not None and seq.finish_s >= 0 and seq.finish_reason != "abort":
            unique = f"{record.req.request_id:08x}{attempt.index:02x}{self.ids.generate_span_id():016x}"
            if self.attribute_set == "sglang":
                # Unified (not disaggregated) mode: the role is empty, so the name starts with a space.
                rid, name, kind = unique.ljust(32, "0"), f" Req {unique[:8]}", SpanKind.INTERNAL
                service, scope = SGLANG_SERVICE, SCOPES.sglang
                attributes = self._sglang_attributes(record, attempt, rid)
            else:
                rid, name, kind = f"chatcmpl-{unique}", "llm_request", SpanKind.SERVER
                service, scope = ENGINE_SERVICE, SCOPES.engine
                attributes = self._engine_attributes(record, attempt, rid)
            out.append(
                ReadableSpan(
                    name=name,
                    context=SpanContext(trace_id, self.ids.generate_span_id(), False, _SAMPLED),
                    parent=SpanContext(trace_id, ctx.span_id, True, _SAMPLED),
                    resource=self.resources.get(service, attempt.engine_version, attempt.replica),
                    attributes=attributes,
                    kind=kind,
                    instrumentation_scope=scope,
                    start_time=self._ns(seq.arrival_s),
                    end_time=self._ns(seq.finish_s),
                )
            )
        return out

    def _sglang_attributes(self, record: RequestRecord, attempt: Attempt, rid: str) -> dict[str, str | int | float]:
        """What SGLang 0.5.23 writes on its root span at completion (telemetry.md 3.1)."""
        seq = attempt.seq
        assert seq is not None
        req = record.req
        attrs: dict[str, str | int | float] = {"rid": rid, "module": "sglang::request", "gen_ai.request.id": rid}
        params: tuple[tuple[str, float | int], ...] = (
            ("gen_ai.request.max_tokens", req.max_tokens),
            ("gen_ai.request.top_p", req.top_p),
            ("gen_ai.request.temperature", req.temperature),
            ("gen_ai.request.n", 1),
        )
        attrs.update((k, v) for k, v in params if v)  # each only when truthy
        attrs["gen_ai.response.model"] = record.model
        attrs["gen_ai.response.finish_reasons"] = json.dumps([seq.finish_reason])
        attrs["gen_ai.usage.prompt_tokens"] = seq.prompt_len
        attrs["gen_ai.usage.completion_tokens"] = seq.generated
        attrs["gen_ai.usage.cached_tokens"] = seq.cached_tokens
        attrs["gen_ai.latency.time_to_first_token"] = seq.first_token_s - seq.arrival_s
        attrs["gen_ai.latency.e2e"] = seq.finish_s - seq.arrival_s
        attrs["gen_ai.latency.time_in_model_prefill"] = seq.first_token_s - seq.scheduled_s
        attrs["gen_ai.latency.time_in_model_decode"] = seq.last_token_s - seq.first_token_s
        attrs["gen_ai.latency.time_in_model_inference"] = seq.last_token_s - seq.scheduled_s
        return attrs

    def _engine_attributes(self, record: RequestRecord, attempt: Attempt, rid: str) -> dict[str, str | int | float]:
        seq = attempt.seq
        assert seq is not None
        req = record.req
        attrs: dict[str, str | int | float] = {"gen_ai.request.id": rid}
        params: tuple[tuple[str, float | int], ...] = (
            ("gen_ai.request.temperature", req.temperature),
            ("gen_ai.request.top_p", req.top_p),
            ("gen_ai.request.max_tokens", req.max_tokens),
            ("gen_ai.request.n", 1),
        )
        if self.attribute_set == "v0":
            attrs["gen_ai.response.model"] = record.model
            attrs.update(params)  # V0 always sets them
            attrs["gen_ai.usage.num_sequences"] = 1
        else:
            attrs.update((k, v) for k, v in params if v)  # V1: only when truthy
        attrs["gen_ai.usage.prompt_tokens"] = seq.prompt_len
        attrs["gen_ai.usage.completion_tokens"] = seq.generated
        attrs["gen_ai.latency.time_in_queue"] = seq.scheduled_s - seq.arrival_s
        attrs["gen_ai.latency.time_to_first_token"] = seq.first_token_s - seq.arrival_s
        attrs["gen_ai.latency.e2e"] = seq.finish_s - seq.arrival_s
        if self.attribute_set == "v0":
            # V0 recorded the CPU time the scheduler spent on the request: about 0.1 ms per step it took part in.
            attrs["gen_ai.latency.time_in_scheduler"] = 1e-4 * (seq.generated + 1)
        else:
            attrs["gen_ai.latency.time_in_model_prefill"] = seq.first_token_s - seq.scheduled_s
            attrs["gen_ai.latency.time_in_model_decode"] = seq.last_token_s - seq.first_token_s
            attrs["gen_ai.latency.time_in_model_inference"] = seq.last_token_s - seq.scheduled_s
        return attrs


def _http_status(attempt: Attempt | None) -> int:
    if attempt is None:
        return 500
    if attempt.status == "timeout":
        return 504
    return attempt.http_status or 500


# ----------------------------------------------------------------------------- metrics

_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "vllm:prefix_cache_queries_total",
        "prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    ("vllm:prefix_cache_hits_total", "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("vllm:num_preemptions_total", "preemptions", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens_total", "prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens_total", "generation_tokens", "Number of generation tokens processed."),
)
_HISTOGRAMS: tuple[tuple[str, str, str, str], ...] = (
    ("vllm:iteration_tokens_total", "iteration_tokens", "Histogram of number of tokens per engine_step.", "1"),
    ("vllm:time_to_first_token_seconds", "ttft", "Histogram of time to first token in seconds.", "s"),
    ("vllm:inter_token_latency_seconds", "itl", "Histogram of inter-token latency in seconds.", "s"),
    ("vllm:e2e_request_latency_seconds", "e2e", "Histogram of e2e request latency in seconds.", "s"),
    ("vllm:request_queue_time_seconds", "queue", "Histogram of time spent in WAITING phase for request.", "s"),
)


_SGLANG_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("sglang:prompt_tokens_total", "prompt_tokens", "Number of prefill tokens processed."),
    ("sglang:generation_tokens_total", "generation_tokens", "Number of generation tokens processed."),
    ("sglang:cached_tokens_total", "prefix_cache_hits", "Number of cached prompt tokens."),
    ("sglang:num_retracted_requests_total", "preemptions", "Total number of retracted requests."),
)
_SGLANG_HISTOGRAMS: tuple[tuple[str, str, str, str], ...] = (
    ("sglang:time_to_first_token_seconds", "ttft", "Histogram of time to first token in seconds.", "s"),
    ("sglang:inter_token_latency_seconds", "itl", "Histogram of inter-token latency in seconds.", "s"),
    ("sglang:e2e_request_latency_seconds", "e2e", "Histogram of End-to-end request latency in seconds", "s"),
    ("sglang:queue_time_seconds", "queue", "Histogram of queueing time in seconds.", "s"),
)


class MetricBuilder:
    """The engine's Prometheus metrics of every replica at one scrape, as SDK ``MetricsData``.

    Attributes:
        epoch_ns: Unix time in ns of simulated time 0 (also the counters' start time).
        attribute_set: ``"sglang"`` for SGLang's names and labels, else vLLM's.
    """

    def __init__(self, epoch_ns: int, resources: _Resources | None = None, attribute_set: str = "v1") -> None:
        self.epoch_ns = epoch_ns
        self.resources = resources or _Resources()
        self.attribute_set = attribute_set
        # (prefix-cache hits, queries, prompt tokens) per replica at the last scrape: SGLang's
        # hit-rate gauge covers the recent past, not the replica's whole life.
        self._last_cache: dict[str, tuple[int, int, int]] = {}

    def build(self, time_s: float, replicas: Sequence[Replica]) -> MetricsData:
        """One scrape of all replicas at simulated time ``time_s``."""
        now = self.epoch_ns + round(time_s * _NS)
        out: list[ResourceMetrics] = []
        for r in replicas:
            if self.attribute_set == "sglang":
                metrics, service = self._sglang(r, now), SGLANG_SERVICE
            else:
                metrics, service = self._vllm(r, now), ENGINE_SERVICE
            res = self.resources.get(service, r.version, r.name)
            out.append(ResourceMetrics(res, [ScopeMetrics(SCOPES.prometheus, metrics, "")], ""))
        return MetricsData(out)

    def _vllm(self, r: Replica, now: int) -> list[Metric]:
        labels = {"model_name": r.profile.model, "engine": "0"}
        stats = r.stats
        metrics: list[Metric] = [
            _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, now,
                   len(r.running)),
            _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, now,
                   len(r.waiting)),
            _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, now,
                   r.pool.usage()),
        ]  # fmt: skip
        metrics += self._counters(_COUNTERS, stats, labels, now)
        success = [
            NumberDataPoint({**labels, "finished_reason": reason}, self.epoch_ns, now, count)
            for reason, count in sorted(stats.request_success.items())
        ]
        if success:
            metrics.append(
                Metric("vllm:request_success_total", "Count of successfully processed requests.", "1",
                       Sum(success, AggregationTemporality.CUMULATIVE, True))
            )  # fmt: skip
        return metrics + self._histograms(_HISTOGRAMS, stats, labels, now)

    def _sglang(self, r: Replica, now: int) -> list[Metric]:
        labels = {"model_name": r.profile.model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
        stats = r.stats
        hits0, queries0, prompts0 = self._last_cache.get(r.name, (0, 0, 0))
        self._last_cache[r.name] = (stats.prefix_cache_hits, stats.prefix_cache_queries, stats.prompt_tokens)
        queried = stats.prefix_cache_queries - queries0
        metrics: list[Metric] = [
            _gauge("sglang:num_running_reqs", "The number of running requests.", labels, now, len(r.running)),
            _gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", labels, now,
                   len(r.waiting)),
            _gauge("sglang:token_usage", "The token usage.", labels, now, r.pool.usage()),
        ]  # fmt: skip
        if queried > 0:
            rate = (stats.prefix_cache_hits - hits0) / queried
            metrics.append(_gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", labels, now, rate))
        elif stats.prompt_tokens > prompts0:  # prompts but no lookups: the radix cache is off
            metrics.append(_gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", labels, now, 0.0))
        metrics += self._counters(_SGLANG_COUNTERS, stats, labels, now)
        requests = NumberDataPoint(labels, self.epoch_ns, now, sum(stats.request_success.values()))
        metrics.append(
            Metric("sglang:num_requests_total", "Number of requests processed.", "1",
                   Sum([requests], AggregationTemporality.CUMULATIVE, True))
        )  # fmt: skip
        return metrics + self._histograms(_SGLANG_HISTOGRAMS, stats, labels, now)

    def _counters(
        self, table: tuple[tuple[str, str, str], ...], stats: ReplicaStats, labels: dict[str, str], now: int
    ) -> list[Metric]:
        cumulative = AggregationTemporality.CUMULATIVE
        return [
            Metric(name, doc, "1", Sum([NumberDataPoint(labels, self.epoch_ns, now, getattr(stats, field_name))],
                                       cumulative, True))
            for name, field_name, doc in table
        ]  # fmt: skip

    def _histograms(
        self, table: tuple[tuple[str, str, str, str], ...], stats: ReplicaStats, labels: dict[str, str], now: int
    ) -> list[Metric]:
        out = []
        for name, field_name, doc, unit in table:
            hist: EngineHistogram = getattr(stats, field_name)
            point = HistogramDataPoint(
                labels, self.epoch_ns, now, hist.count, hist.sum, list(hist.counts), list(hist.bounds), hist.min,
                hist.max,
            )  # fmt: skip
            out.append(Metric(name, doc, unit, Histogram([point], AggregationTemporality.CUMULATIVE)))
        return out


def _gauge(name: str, doc: str, labels: dict[str, str], now: int, value: float) -> Metric:
    return Metric(name, doc, "1", Gauge([NumberDataPoint(labels, now, now, value)]))


class TelemetryEmitter:
    """A :class:`~sre_agent.replays.gateway.TelemetrySink` that builds spans and metrics and hands them to an output.

    Spans are buffered and exported in batches of ``batch_spans``; each scrape
    is exported as it happens. With ``speed`` set, export is paced so that
    simulated time runs ``speed`` times faster than the wall clock
    (``clock`` and ``sleep`` are injectable).
    """

    def __init__(
        self,
        output: TelemetryOutput,
        epoch_ns: int,
        *,
        seed: int,
        attribute_set: str = "v1",
        batch_spans: int = 4096,
        speed: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.output = output
        self.spans = SpanBuilder(epoch_ns, seed, attribute_set)
        self.metrics = MetricBuilder(epoch_ns, self.spans.resources, attribute_set)
        self.batch_spans = batch_spans
        self.speed = speed
        self._clock = clock
        self._sleep = sleep
        self._wall0 = clock()
        self._buffer: list[ReadableSpan] = []
        self.span_count = 0
        self.scrape_count = 0
        self.progress: Callable[[float], None] | None = None

    def _pace(self, sim_s: float) -> None:
        if self.speed:
            wait = sim_s / self.speed - (self._clock() - self._wall0)
            if wait > 0:
                self._flush()
                self._sleep(wait)

    def on_request(self, record: RequestRecord) -> None:
        """Build the request's spans; export when the batch is full."""
        spans = self.spans.build(record)
        self._buffer.extend(spans)
        self.span_count += len(spans)
        if len(self._buffer) >= self.batch_spans:
            self._flush()

    def on_metrics(self, time_s: float, replicas: Sequence[Replica]) -> None:
        """Export one scrape of every replica."""
        self._pace(time_s)
        self.output.export_metrics(self.metrics.build(time_s, replicas))
        self.scrape_count += 1
        if self.progress is not None:
            self.progress(time_s)

    def _flush(self) -> None:
        if self._buffer:
            self.output.export_spans(self._buffer)
            self._buffer = []

    def close(self) -> None:
        """Export what is buffered and shut the output down."""
        self._flush()
        self.output.shutdown()
