"""Engine metrics without a Collector: ``sre-agent serve --scrape URL``.

A :class:`Scraper` pulls Prometheus text (vLLM ``/metrics``, SGLang
``--enable-metrics``) every few seconds, turns it into the
``ExportMetricsServiceRequest`` an OTel Collector's ``prometheus`` receiver
would send for it, and stores it through the same function the OTLP metrics
endpoints use (:func:`sre_agent.ingest.otlp.metrics_from_proto`), so the points land
exactly as a Collector's would: the same canonical names, cumulative monotonic
sums for counters, explicit-bucket histograms with their bounds, and a resource
naming the target (``service.name``, ``service.instance.id``, ``host.name``).

The exposition format is parsed by ``prometheus_client``'s parser, not here.
How the Collector's conventions are followed:

- A counter keeps its exposed name (``vllm:prompt_tokens_total``); the store's
  canonical name drops ``_total`` for every source alike.
- A ``_created`` series (``prometheus_client`` exposes one per counter and
  histogram) becomes the start time of its series instead of a gauge of its
  own. Without one, the start time is when the series was first seen or was
  last seen to reset, as the Collector's start-time adjuster does.
- Prometheus buckets are cumulative; OTLP ``bucket_counts`` are per bucket,
  with the ``+Inf`` bucket last and ``explicit_bounds`` the finite ``le``.
- Untyped samples become gauges.

A target that is down, answers an error status or sends something that is not
Prometheus text is logged (once per change of state, not every interval) and
counted on ``/metrics`` (:meth:`Scraper.render_prometheus`); the scraper keeps
its interval and the target is stored again as soon as it answers.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import httpx
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from sre_agent.config import ScrapeTarget
from sre_agent.errors import BadPayloadError, IngestError, StoreError
from sre_agent.ingest.receiver import prometheus_family

if TYPE_CHECKING:
    import pyarrow as pa

    from sre_agent.ingest.normalise import Normaliser

__all__ = ["ScrapeFailure", "Scraper", "exposition_to_request"]

log = logging.getLogger(__name__)

SCOPE_NAME: Final = "sre_agent.ingest.scrape"
# The Collector's default scrape timeout; never longer than the interval.
DEFAULT_TIMEOUT_S: Final = 10.0
_CUMULATIVE: Final = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
_ENGINE_PREFIXES: Final = ("vllm", "sglang")
# Failure reasons, the ``reason`` label of sre_agent_scrape_failures_total.
REASONS: Final = ("unreachable", "http_status", "too_large", "not_prometheus_text", "store")


class ScrapeFailure(IngestError):
    """One scrape that stored nothing; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# -- exposition text -> OTLP ---------------------------------------------------------


def _parse(text: str) -> list[Any]:
    """Metric families of Prometheus text (``prometheus_client`` ``Metric`` objects)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, IndexError, TypeError) as exc:  # the parser's ways of saying "not this format"
        first = next((line for line in text.splitlines() if line.strip()), "")[:80]
        raise BadPayloadError(f"not Prometheus text ({exc or type(exc).__name__}; first line {first!r})") from None


def _labels_key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _attributes(labels: Mapping[str, str]) -> list[KeyValue]:
    out = []
    for key, value in sorted(labels.items()):
        kv = KeyValue(key=key)
        kv.value.string_value = value
        out.append(kv)
    return out


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _engine_of(families: Iterable[Any]) -> str | None:
    for family in families:
        prefix = family.name.split(":", 1)[0] if ":" in family.name else ""
        if prefix in _ENGINE_PREFIXES:
            return str(prefix)
    return None


@dataclass
class StartTimes:
    """Start times of cumulative series across scrapes (the Collector's start-time adjuster).

    A series starts when it is first seen; a total below the previous one is a
    reset (the engine restarted) and starts it again.
    """

    _series: dict[tuple[Any, ...], tuple[int, float]] = field(default_factory=dict)

    def start(self, key: tuple[Any, ...], total: float, time_ns: int) -> int:
        """The start time (Unix ns) of the series ``key`` whose running total is ``total`` at ``time_ns``."""
        known = self._series.get(key)
        start = time_ns if known is None or total < known[1] else known[0]
        self._series[key] = (start, total)
        return start


def exposition_to_request(
    text: str, target: ScrapeTarget, time_ns: int, starts: StartTimes | None = None
) -> ExportMetricsServiceRequest:
    """The OTLP request a Collector would send for one scrape of ``target``.

    Args:
        text: the Prometheus text exposition (format 0.0.4).
        target: the scraped endpoint; it names the resource.
        time_ns: when the scrape happened, Unix epoch ns (samples without a timestamp get it).
        starts: start times carried over from earlier scrapes of the same target (``None`` = a fresh one).

    Raises:
        BadPayloadError: ``text`` is not Prometheus text.
    """
    families = _parse(text)
    starts = StartTimes() if starts is None else starts
    created, created_names = _created_times(families)
    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    resource = {
        "service.name": target.service or _engine_of(families) or target.address,
        "service.instance.id": target.instance_id,
        "host.name": target.host_name,
    }
    if target.version:
        resource["service.version"] = target.version
    resource_metrics.resource.attributes.extend(_attributes(resource))
    scope = resource_metrics.scope_metrics.add()
    scope.scope.name = SCOPE_NAME
    for family in families:
        if family.samples and all(sample.name in created_names for sample in family.samples):
            continue  # a start time, already taken by its series
        metric = metrics_pb2.Metric(name=family.name, description=family.documentation)
        if family.type == "counter":
            _fill_counter(metric, family, time_ns, created, starts)
        elif family.type == "histogram":
            _fill_histogram(metric, family, time_ns, created, starts)
        elif family.type == "summary":
            _fill_summary(metric, family, time_ns, created, starts)
        elif family.type == "gaugehistogram":
            continue  # OpenMetrics only; no engine here exposes one
        else:  # gauge, untyped, info, stateset: gauges, as the Collector stores them
            _fill_gauge(metric, family, time_ns)
        if metric.WhichOneof("data") is not None:
            scope.metrics.append(metric)
    return request


def _created_times(families: list[Any]) -> tuple[dict[tuple[Any, ...], int], set[str]]:
    """Start ns per (base name, labels) from ``<base>_created`` series, and the names of those series.

    Only series whose base is a counter, histogram or summary family count:
    an engine gauge that happens to end in ``_created`` stays a gauge.
    """
    bases = {f.name for f in families if f.type in ("counter", "histogram", "summary")}
    times: dict[tuple[Any, ...], int] = {}
    names: set[str] = set()
    for family in families:
        for sample in family.samples:
            base = sample.name.removesuffix("_created")
            if base != sample.name and base in bases:
                names.add(sample.name)
                if math.isfinite(sample.value) and sample.value > 0:
                    times[(base, _labels_key(sample.labels))] = _ns(sample.value)
    return times, names


def _point_time(sample: Any, time_ns: int) -> int:
    return _ns(float(sample.timestamp)) if sample.timestamp is not None else time_ns


def _start(
    family: Any,
    labels: Mapping[str, str],
    total: float,
    time_ns: int,
    *,
    created: dict[tuple[Any, ...], int],
    starts: StartTimes,
) -> int:
    known = created.get((family.name, _labels_key(labels)))
    running = starts.start((family.name, _labels_key(labels)), total, time_ns)
    return known if known is not None else running


def _fill_gauge(metric: metrics_pb2.Metric, family: Any, time_ns: int) -> None:
    for sample in family.samples:
        point = metric.gauge.data_points.add()
        point.time_unix_nano = _point_time(sample, time_ns)
        point.as_double = float(sample.value)
        point.attributes.extend(_attributes(sample.labels))


def _fill_counter(
    metric: metrics_pb2.Metric, family: Any, time_ns: int, created: dict[tuple[Any, ...], int], starts: StartTimes
) -> None:
    metric.sum.aggregation_temporality = _CUMULATIVE
    metric.sum.is_monotonic = True
    for sample in family.samples:
        if sample.name != family.name + "_total":
            continue  # e.g. a _created sample in the family (OpenMetrics)
        metric.name = sample.name
        point = metric.sum.data_points.add()
        point.time_unix_nano = _point_time(sample, time_ns)
        point.start_time_unix_nano = _start(
            family, sample.labels, float(sample.value), time_ns, created=created, starts=starts
        )
        point.as_double = float(sample.value)
        point.attributes.extend(_attributes(sample.labels))


@dataclass
class _Buckets:
    labels: dict[str, str]
    cumulative: list[tuple[float, float]] = field(default_factory=list)
    count: float | None = None
    total: float | None = None
    timestamp: Any = None


def _group_buckets(family: Any) -> list[_Buckets]:
    groups: dict[tuple[Any, ...], _Buckets] = {}
    for sample in family.samples:
        labels = {k: v for k, v in sample.labels.items() if k not in ("le", "quantile")}
        group = groups.setdefault(_labels_key(labels), _Buckets(labels))
        group.timestamp = sample.timestamp if sample.timestamp is not None else group.timestamp
        suffix = sample.name[len(family.name) :]
        if suffix == "_bucket" and "le" in sample.labels:
            group.cumulative.append((float(sample.labels["le"]), float(sample.value)))
        elif suffix == "" and "quantile" in sample.labels:
            group.cumulative.append((float(sample.labels["quantile"]), float(sample.value)))
        elif suffix == "_count":
            group.count = float(sample.value)
        elif suffix == "_sum":
            group.total = float(sample.value)
    return list(groups.values())


def _fill_histogram(
    metric: metrics_pb2.Metric, family: Any, time_ns: int, created: dict[tuple[Any, ...], int], starts: StartTimes
) -> None:
    metric.histogram.aggregation_temporality = _CUMULATIVE
    for group in _group_buckets(family):
        ordered = sorted(group.cumulative)
        finite = [(le, c) for le, c in ordered if math.isfinite(le)]
        inf_total = next((c for le, c in ordered if le == math.inf), group.count)
        if inf_total is None or not math.isfinite(inf_total):
            continue  # neither +Inf nor _count: the observations cannot be counted
        per_bucket: list[int] = []
        previous = 0.0
        for _le, cumulative in [*finite, (math.inf, inf_total)]:
            if not cumulative >= previous:  # decreasing (or NaN) buckets: not a histogram; skip the series
                break
            per_bucket.append(round(cumulative - previous))
            previous = cumulative
        else:
            point = metric.histogram.data_points.add()
            point.time_unix_nano = _point_time(group, time_ns)
            point.count = round(group.count if group.count is not None else inf_total)
            point.start_time_unix_nano = _start(
                family, group.labels, point.count, time_ns, created=created, starts=starts
            )
            if group.total is not None:
                point.sum = group.total
            point.explicit_bounds.extend(le for le, _c in finite)
            point.bucket_counts.extend(per_bucket)
            point.attributes.extend(_attributes(group.labels))


def _fill_summary(
    metric: metrics_pb2.Metric, family: Any, time_ns: int, created: dict[tuple[Any, ...], int], starts: StartTimes
) -> None:
    for group in _group_buckets(family):
        if group.count is None or not math.isfinite(group.count) or group.count < 0:
            continue
        point = metric.summary.data_points.add()
        point.time_unix_nano = _point_time(group, time_ns)
        point.count = round(group.count)
        point.start_time_unix_nano = _start(family, group.labels, point.count, time_ns, created=created, starts=starts)
        point.sum = group.total if group.total is not None else 0.0
        for quantile, value in sorted(group.cumulative):
            point.quantile_values.add(quantile=quantile, value=value)
        point.attributes.extend(_attributes(group.labels))


# -- the scraper ------------------------------------------------------------------------


@dataclass
class _TargetStats:
    attempts: int = 0
    points: int = 0
    rejected: int = 0
    up: bool | None = None  # None until the first scrape
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    last_reason: str | None = None


class Scraper:
    """Scrapes every target each ``interval_s`` seconds on one thread and stores the points.

    Args:
        targets: the endpoints to pull.
        interval_s: seconds between the starts of two rounds.
        submit: stores a canonical metric-points table; returns a future of the
            rows stored (``Writer.submit("metric_points", ...)`` in ``serve``).
        normaliser: the ingest normaliser (attribute redaction, as for OTLP).
        client: the HTTP client (``None`` = one owned and closed by the scraper).
        timeout_s: per-scrape timeout (``None`` = ``min(interval_s, 10)``).
        max_body_bytes: the largest exposition accepted, bytes.
        clock_ns: the wall clock, Unix ns (injectable for tests).
    """

    def __init__(
        self,
        targets: Iterable[ScrapeTarget],
        *,
        interval_s: float,
        submit: Callable[[pa.Table], concurrent.futures.Future[int]],
        normaliser: Normaliser,
        client: httpx.Client | None = None,
        timeout_s: float | None = None,
        max_body_bytes: int = 64 * 1024 * 1024,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.targets = tuple(targets)
        self.interval_s = interval_s
        self.timeout_s = min(interval_s, DEFAULT_TIMEOUT_S) if timeout_s is None else timeout_s
        self._submit = submit
        self._normaliser = normaliser
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=self.timeout_s, headers={"accept": "text/plain"})
        self._max_body_bytes = max_body_bytes
        self._clock_ns = clock_ns
        self._starts = {t.url: StartTimes() for t in self.targets}
        self._stats = {t.url: _TargetStats() for t in self.targets}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> None:
        """Start scraping in a daemon thread (first round right away)."""
        if self._thread is None and self.targets:
            self._thread = threading.Thread(target=self._run, name="sre-agent-scrape", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop after the scrape in progress (safe to call twice); closes an owned client."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 30.0 if timeout_s is None else timeout_s)
        if self._owns_client:
            self._client.close()

    def _run(self) -> None:
        next_round = time.monotonic()
        while not self._stop.is_set():
            for target in self.targets:
                if self._stop.is_set():
                    return
                self.scrape(target)
            next_round += self.interval_s
            # A round longer than the interval skips the missed rounds rather than bunching scrapes.
            next_round = max(next_round, time.monotonic())
            self._stop.wait(next_round - time.monotonic())

    # -- one scrape

    def scrape(self, target: ScrapeTarget) -> int:
        """Scrape ``target`` once and store its points; returns the points stored (0 on failure).

        Never raises for a bad target: failures are logged and counted.
        """
        stats = self._stats[target.url]
        with self._lock:
            stats.attempts += 1
        try:
            stored, rejected = self._scrape(target)
        except ScrapeFailure as exc:
            self._record(target, stats, exc)
            return 0
        except Exception as exc:  # boundary: a scrape must never stop the server
            log.exception("scrape of %s failed unexpectedly", target.url)
            self._record(target, stats, ScrapeFailure("store", f"unexpected error: {exc!r}"))
            return 0
        with self._lock:
            stats.points += stored
            stats.rejected += rejected
            if stats.up is False:
                log.warning("scrape target %s is back", target.url)
            stats.up, stats.last_reason = True, None
        return stored

    def _record(self, target: ScrapeTarget, stats: _TargetStats, failure: ScrapeFailure) -> None:
        with self._lock:
            stats.failures[failure.reason] += 1
            # One line per change of state or reason, not one per interval (a message may vary, e.g. its errno).
            changed = stats.up is not False or stats.last_reason != failure.reason
            stats.up, stats.last_reason = False, failure.reason
        if changed:
            log.warning("scrape of %s failed (%s): %s", target.url, failure.reason, failure)

    def _fetch(self, target: ScrapeTarget) -> str:
        try:
            with self._client.stream("GET", target.url, timeout=self.timeout_s) as response:
                if response.status_code != 200:
                    raise ScrapeFailure("http_status", f"HTTP {response.status_code}")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > self._max_body_bytes:
                        raise ScrapeFailure("too_large", f"more than {self._max_body_bytes} bytes")
                charset = response.charset_encoding or "utf-8"
        except httpx.HTTPError as exc:
            raise ScrapeFailure("unreachable", f"{type(exc).__name__}: {exc}") from None
        try:
            return bytes(body).decode(charset)
        except (UnicodeDecodeError, LookupError):
            raise ScrapeFailure("not_prometheus_text", f"not {charset} text") from None

    def _scrape(self, target: ScrapeTarget) -> tuple[int, int]:
        from sre_agent.ingest.otlp import metrics_from_proto

        text = self._fetch(target)
        time_ns = self._clock_ns()
        try:
            request = exposition_to_request(text, target, time_ns, self._starts[target.url])
        except BadPayloadError as exc:
            raise ScrapeFailure("not_prometheus_text", str(exc)) from None
        decoded = metrics_from_proto(request, self._normaliser)
        if decoded.table.num_rows == 0:
            return 0, decoded.rejected
        try:
            self._submit(decoded.table).result(timeout=max(self.interval_s, 30.0))
        except (IngestError, StoreError, concurrent.futures.TimeoutError) as exc:
            raise ScrapeFailure("store", f"not stored: {exc}") from None
        return decoded.table.num_rows, decoded.rejected

    # -- /metrics

    def render_prometheus(self) -> str:
        """The scraper's own counters in the Prometheus text format, per target."""
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            labelled = [(f"{{{labels}}}", value) for labels, value in samples]
            lines.extend(prometheus_family(f"sre_agent_scrape_{name}", kind, help_text, labelled))

        with self._lock:
            rows = [(_label_value(url), s) for url, s in self._stats.items()]
            family(
                "attempts_total",
                "counter",
                "Scrapes tried per target.",
                [(f'target="{u}"', s.attempts) for u, s in rows],
            )
            family(
                "failures_total",
                "counter",
                "Scrapes that stored nothing, per target and reason.",
                [(f'target="{u}",reason="{r}"', n) for u, s in rows for r, n in s.failures.items()],
            )
            family(
                "points_total",
                "counter",
                "Metric points stored per target.",
                [(f'target="{u}"', s.points) for u, s in rows],
            )
            family(
                "points_rejected_total",
                "counter",
                "Points of a scrape rejected one by one (as OTLP partial success).",
                [(f'target="{u}"', s.rejected) for u, s in rows],
            )
            family(
                "up",
                "gauge",
                "1 if the last scrape of the target stored its points, else 0.",
                [(f'target="{u}"', 1.0 if s.up else 0.0) for u, s in rows],
            )
        return "\n".join(lines) + "\n"


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
