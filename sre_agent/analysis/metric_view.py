"""The metric stream (``metric_points``) seen per side of a comparison.

Rules ask for engine-neutral *signals* (``running_requests``,
``prefix_cache_hits``; see :data:`sre_agent.store.schema.METRIC_SIGNALS`); the first
canonical metric name that has data wins. Counters are cumulative, so every
counter figure here is a **delta** within the window (summed over series,
with resets handled), never a raw value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from sre_agent.analysis.histogram_delta import HistogramDelta, time_blocks
from sre_agent.analysis.metric_sql import REPLICA, REPLICA_KEY, increments_sql, interval_rows
from sre_agent.analysis.rules_api import SIDES, SidePair
from sre_agent.store.schema import METRIC_SIGNALS
from sre_agent.store.sql_text import literal

if TYPE_CHECKING:
    import duckdb

    from sre_agent.analysis.resolve import SideWindow
    from sre_agent.analysis.selection import Selection

__all__ = ["HistogramDelta", "MetricView", "fetch_one"]


#: Scrapes with requests waiting that :meth:`MetricView.running_under_backlog` needs on a side.
MIN_BACKLOG_SCRAPES: Final[int] = 2
#: Requests waiting at a scrape that make a queue for :meth:`MetricView.cap_binds` (one may just have arrived).
QUEUED: Final[float] = 2.0


def fetch_one(result: duckdb.DuckDBPyConnection) -> Any:
    """The first row of an executed query, or ``None``; consumes the whole result.

    DuckDB 2 refuses new work on a connection whose last result is not fully
    fetched, so ``fetchone()`` on an aggregate would poison a shared cursor.
    """
    rows = result.fetchall()
    return rows[0] if rows else None


class MetricView:
    """Signals of the metric stream for the baseline and candidate windows.

    All methods return ``None`` (or a :class:`SidePair` of ``None``) for a
    signal that has no points; nothing raises for absent metrics.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        baseline: SideWindow,
        candidate: SideWindow,
        selection: Selection,
        *,
        filter_sql: str = "TRUE",
    ):
        self._con = con
        self._sides = {"baseline": baseline, "candidate": candidate}
        self._selection = selection
        # The selection's --where filters as they apply to metric_points (built by the comparison):
        # metrics are never read unfiltered when a filter is set.
        self._filter_sql = filter_sql
        self._cache: dict[tuple[Any, ...], Any] = {}

    def _where(self, side: str, name: str) -> str:
        w = self._sides[side]
        parts = [f"name = {literal(name)}", f"time_ns >= {w.start_ns}", f"time_ns < {w.end_ns}"]
        if w.version is not None:
            parts.append(f"service_version = {literal(w.version)}")
        if self._selection.service is not None:
            parts.append(f"service_name = {literal(self._selection.service)}")
        if self._filter_sql != "TRUE":
            parts.append(f"({self._filter_sql})")
        return " AND ".join(parts)

    def _memo(self, key: tuple[Any, ...], compute: Callable[[], SidePair]) -> SidePair:
        # The store is read as of one diagnosis: several rules ask for the same counters.
        if key not in self._cache:
            self._cache[key] = compute()
        result: SidePair = self._cache[key]
        return result

    def name_for(self, signal: str) -> str | None:
        """The canonical metric name carrying ``signal`` in these windows, or ``None``."""
        key = ("name", signal)
        if key not in self._cache:
            names = METRIC_SIGNALS.get(signal, (signal,))
            found = None
            for name in names:
                row = fetch_one(
                    self._con.execute(
                        f"SELECT count(*) FROM metric_points WHERE {self._where('baseline', name)} "
                        f"OR {self._where('candidate', name)}"
                    )
                )
                if row and row[0]:
                    found = name
                    break
            self._cache[key] = found
        result: str | None = self._cache[key]
        return result

    def has(self, signal: str) -> bool:
        """Whether the signal has points in either window."""
        return self.name_for(signal) is not None

    def has_latency_histograms(self, side: str | None = None) -> bool:
        """Whether any latency histogram (TTFT, ITL, e2e, queue) has observations (on ``side``, or either)."""
        signals = ("ttft_seconds", "itl_seconds", "e2e_seconds", "queue_seconds")
        if side is None:
            return any(self.has(s) for s in signals)
        return any(self.has(s) and self.histogram(s)[side] is not None for s in signals)

    def gauge(self, signal: str, stat: str = "mean") -> SidePair:
        """A gauge over each window: ``mean``, ``max``, ``p90`` of all points, or ``sum_mean``.

        ``sum_mean`` sums the series at each timestamp (e.g. requests
        running across all replicas) and averages those totals.
        """
        return self._memo(("gauge", signal, stat), lambda: self._gauge(signal, stat))

    def _gauge(self, signal: str, stat: str = "mean") -> SidePair:
        """Uncached :meth:`gauge`."""
        name = self.name_for(signal)
        if name is None:
            return SidePair(None, None)
        agg = {"mean": "avg(value)", "max": "max(value)", "p90": "quantile_cont(value, 0.9)"}
        values: list[float | None] = []
        for side in SIDES:
            where = self._where(side, name) + " AND isfinite(value)"
            if stat == "sum_mean":
                sql = f"SELECT avg(t) FROM (SELECT sum(value) AS t FROM metric_points WHERE {where} GROUP BY time_ns)"
            else:
                sql = f"SELECT {agg[stat]} FROM metric_points WHERE {where}"
            row = fetch_one(self._con.execute(sql))
            values.append(None if row is None or row[0] is None else float(row[0]))
        return SidePair(values[0], values[1])

    def running_per_replica(self) -> SidePair:
        """Mean requests running per serving replica: each instance's window mean of the running
        gauge, summed, over :meth:`serving_replicas`.

        The plain :meth:`gauge` mean averages every point, so a replica removed at the deploy
        that keeps exporting a running gauge of 0 halves the candidate's batch when half the
        replicas go (1030005: 2.8 -> 3.1 running per replica "flat" while the two replicas left
        ran 5.5 each). Summing per-instance means needs no aligned scrape times. Falls back
        to the plain mean when the serving replicas are unknown.
        """
        return self._memo(("running_per_replica",), self._running_per_replica)

    def _running_per_replica(self) -> SidePair:
        """Uncached :meth:`running_per_replica`."""
        name = self.name_for("running_requests")
        if name is None:
            return SidePair(None, None)
        serving = self.serving_replicas()
        plain = self.gauge("running_requests")
        values: list[float | None] = []
        pairs = zip(SIDES, (serving.baseline, serving.candidate), (plain.baseline, plain.candidate), strict=True)
        for side, replicas, fallback in pairs:
            where = self._where(side, name) + " AND isfinite(value)"
            row = fetch_one(
                self._con.execute(
                    f"SELECT sum(m) FROM (SELECT avg(value) AS m FROM metric_points WHERE {where} "
                    "GROUP BY coalesce(service_instance, host_name, series_key))"
                )
            )
            total = None if row is None or row[0] is None else float(row[0])
            values.append(total / replicas if total is not None and replicas else fallback)
        return SidePair(values[0], values[1])

    def running_under_backlog(self) -> SidePair:
        """Median requests running on a replica at the scrapes where that replica had requests waiting.

        An engine that queues requests while it could run more is at a cap: so, the running
        gauge read where the same instance's waiting gauge is above 0 (same scrape time) is
        where it saturates (the running cap ``max_num_seqs``, or what its KV pool holds).
        ``None`` for a side with fewer than :data:`MIN_BACKLOG_SCRAPES` such scrapes (nothing
        waited long enough to show a cap). The median, so that a scrape at a hot swap (the
        old cap's requests still running) does not stand for the new cap.
        """
        return self._memo(("running_under_backlog",), lambda: self._of_backlog(lambda v: float(np.median(v[:, 0]))))

    def cap_binds(self) -> SidePair:
        """Share of the scrapes with a queue (2+ waiting) that read one running count, 0..1.

        A cap on running requests (``max_num_seqs``) holds the gauge at the cap while a queue
        waits, so most such scrapes read the same number; an engine that admits slowly (a small
        token budget splitting prompts over many steps) queues requests at whatever it happens
        to run, spread below its peak. One waiting request is left out: it may have arrived since
        the last step, at any running count (dev 1160283, cap 11: single waits at 4-10 running,
        every queue of 4-7 at 11). The count is the lower quartile, since at a hot swap the
        requests the old cap admitted only add above the new one; "reading" it is within 10 %
        of it, or 1 request. ``None`` for a side with fewer than :data:`MIN_BACKLOG_SCRAPES` such scrapes.
        """

        def share(pairs: np.ndarray) -> float | None:
            values = pairs[pairs[:, 1] >= QUEUED, 0]
            if values.size < MIN_BACKLOG_SCRAPES:
                return None
            floor = float(np.quantile(values, 0.25))
            return float(np.mean(np.abs(values - floor) <= max(1.0, 0.1 * floor)))

        return self._memo(("cap_binds",), lambda: self._of_backlog(share))

    def running_at_queues(self) -> SidePair:
        """How full a replica ran while requests queued: running / its peak, weighted by requests waiting, 0..1.

        A cap on running requests (``max_num_seqs``) holds a request back only while every slot
        is taken, so where requests wait the replica runs at the most it ever runs. An engine
        that admits slowly (a small step budget) queues at whatever it runs (1260201: budget
        16384 -> 256, 23 waiting at 2 running on a replica that ran 5 between queues: 0.68);
        a peak that fell by chance lies above where a few requests waited (1270143: 3 waiting at
        5-6 running, peaks of 8: 0.69); true cuts of ``max_num_seqs`` read 0.95-1.0. Each
        scrape with :data:`QUEUED` or more waiting counts by its waiting requests, against its
        replica's peak after the replica first ran at most the median it queued at (within 10 %
        or one request): the requests an old, higher cap admitted before a hot swap drain first
        (1140136: peak 44 after a cut 64 -> 4). ``None`` for a side where nothing queued.
        """
        return self._memo(("running_at_queues",), self._running_at_queues)

    def _running_at_queues(self) -> SidePair:
        """Uncached :meth:`running_at_queues`."""
        out: list[float | None] = []
        for rows in self._running_scrapes():
            by_instance: dict[str, list[tuple[float, float]]] = {}
            for i, r, w, _ in rows:
                # A waiting gauge that is missing or not finite at the scrape counts as none waiting.
                by_instance.setdefault(i, []).append((r, w if w is not None and np.isfinite(w) else 0.0))
            full = weight = 0.0
            for series in by_instance.values():
                queued = [r for r, w in series if w >= QUEUED]
                if not queued:
                    continue
                level = float(np.median(queued))
                top = level + max(1.0, 0.1 * level)
                settled = series[next((k for k, (r, _) in enumerate(series) if r <= top), len(series)) :]
                peak = max((r for r, _ in settled), default=0.0)
                if peak <= 0:
                    continue
                for r, w in settled:
                    if w >= QUEUED:
                        full += w * min(1.0, r / peak)
                        weight += w
            out.append(full / weight if weight else None)
        return SidePair(out[0], out[1])

    def _of_backlog(self, summary: Callable[[np.ndarray], float | None]) -> SidePair:
        """``summary`` of each side's (running, waiting) rows at the scrapes with requests waiting."""
        values = [
            np.array([(r, w) for _, r, w, waited in rows if waited], dtype=float).reshape(-1, 2)
            for rows in self._running_scrapes()
        ]
        out = [summary(v) if len(v) >= MIN_BACKLOG_SCRAPES else None for v in values]
        return SidePair(out[0], out[1])

    def _running_scrapes(self) -> list[list[tuple[str, float, float | None, bool]]]:
        """Per side, each running-gauge scrape: (instance, running, waiting at that scrape, requests waited).

        Ordered by instance and time; ``waiting`` is the same instance's waiting gauge at the same
        scrape time (``None`` without one) and ``requests waited`` whether it was above 0. Read
        once per view: :meth:`cap_binds`, :meth:`running_under_backlog` and
        :meth:`running_at_queues` all ask.
        """
        key = ("running_scrapes",)
        if key not in self._cache:
            running, waiting = self.name_for("running_requests"), self.name_for("waiting_requests")
            out: list[list[tuple[str, float, float | None, bool]]] = [[], []]
            if running is not None and waiting is not None:
                instance = "coalesce(service_instance, host_name, series_key)"
                for k, side in enumerate(SIDES):
                    rows = self._con.execute(
                        f"""SELECT r.i, r.value, w.value, coalesce(w.value > 0, false) FROM
                              (SELECT {instance} AS i, time_ns, value FROM metric_points
                               WHERE {self._where(side, running)} AND isfinite(value)) r
                            LEFT JOIN (SELECT {instance} AS i, time_ns, value FROM metric_points
                                       WHERE {self._where(side, waiting)}) w
                              ON r.i = w.i AND r.time_ns = w.time_ns
                            ORDER BY r.i, r.time_ns"""
                    ).fetchall()
                    out[k] = [
                        (str(i), float(r), None if w is None else float(w), bool(waited)) for i, r, w, waited in rows
                    ]
            self._cache[key] = out
        scrapes: list[list[tuple[str, float, float | None, bool]]] = self._cache[key]
        return scrapes

    def itl_by_running(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Per side, each replica's scrape intervals as rows (running, prompt tokens/s, ITL seconds, intervals).

        ``running`` is the mean of the running gauge at the interval's two scrapes (the batch the
        interval's steps ran), ``prompt tokens/s`` the prompt-token counter's increment over the
        interval's seconds (0 without that counter: the prefill the same steps carried), the last
        two the increments of the inter-token latency histogram's sum and count; only intervals
        with an observation. A step's time follows the batch it runs and the prompt tokens it
        shares, so these rows let a rule compare the step at equal batch and prefill, as the span
        rules do at equal overlap. ``None`` without the histogram or the gauge, or when neither
        names the replica the other does.
        """
        key = ("itl_by_running",)
        if key not in self._cache:
            self._cache[key] = self._itl_by_running()
        found: tuple[np.ndarray, np.ndarray] | None = self._cache[key]
        return found

    def _itl_by_running(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Uncached :meth:`itl_by_running`."""
        itl, running = self.name_for("itl_seconds"), self.name_for("running_requests")
        if itl is None or running is None:
            return None
        prompt = self.name_for("prompt_tokens")
        out = [
            interval_rows(
                self._con,
                self._where(side, itl),
                self._where(side, running),
                None if prompt is None else self._where(side, prompt),
            )
            for side in SIDES
        ]
        if not (len(out[0]) and len(out[1])):
            return None
        return out[0], out[1]

    def series_count(self, signal: str) -> SidePair:
        """Distinct series (usually replicas) reporting the signal on each side (none is ``None``)."""
        count = "SELECT count(DISTINCT coalesce(service_instance, host_name, series_key)) FROM metric_points WHERE {}"
        return self._memo(("series", signal), lambda: self._scalar_per_side(signal, count.format, zero_is_none=True))

    def _scalar_per_side(self, signal: str, sql_of: Callable[[str], str], *, zero_is_none: bool = False) -> SidePair:
        """One number per side: ``sql_of`` given the side's WHERE clause for the signal (``None`` when absent)."""
        name = self.name_for(signal)
        if name is None:
            return SidePair(None, None)
        out: list[float | None] = []
        for side in SIDES:
            row = fetch_one(self._con.execute(sql_of(self._where(side, name))))
            value = None if row is None or row[0] is None else float(row[0])
            out.append(None if zero_is_none and not value else value)
        return SidePair(out[0], out[1])

    def serving_replicas(self) -> SidePair:
        """Replicas serving within each window, weighted by how long each served.

        A drained or removed replica may keep exporting frozen counters and a running
        gauge of 0, and a replica removed at the deploy still finishes its in-flight
        requests just after it; neither is capacity. Each instance counts for the share of
        the window between the point before its finished-request count (e2e, else TTFT
        histogram) first rose and the last point at which it rose, so one serving the whole
        window counts about 1 and one drained 15 s into a 300 s window about 0.05. The window
        here is the span in which any instance finished requests: a gap in the traffic that
        idles every replica (bursty arrivals) is not a replica gone. Falls back to the
        instances reporting the running gauge.
        """
        return self._memo(("serving",), self._serving_replicas)

    def _serving_replicas(self) -> SidePair:
        """Uncached :meth:`serving_replicas`."""
        for signal in ("e2e_seconds", "ttft_seconds"):
            name = self.name_for(signal)
            if name is None:
                continue
            out: list[float | None] = []
            for side in SIDES:
                row = fetch_one(
                    self._con.execute(
                        f"""
                    WITH points AS (
                        SELECT coalesce(service_instance, host_name, series_key) AS instance, series_key, time_ns,
                               temporality = 'delta' AND count > 0
                                 OR temporality <> 'delta'
                                    AND count > lag(count) OVER (PARTITION BY series_key ORDER BY time_ns) AS rose,
                               lag(time_ns) OVER (PARTITION BY series_key ORDER BY time_ns) AS prev_ns
                        FROM metric_points WHERE {self._where(side, name)} AND count IS NOT NULL),
                    bounds AS (
                        SELECT coalesce(min(prev_ns) FILTER (WHERE rose), min(time_ns)) AS t0,
                               max(time_ns) FILTER (WHERE rose) AS t1 FROM points),
                    spans AS (
                        SELECT instance, (max(time_ns) FILTER (WHERE rose))
                                         - coalesce(min(prev_ns) FILTER (WHERE rose), min(time_ns)) AS served_ns
                        FROM points GROUP BY series_key, instance)
                    SELECT sum(share) FROM (
                        SELECT instance, max(least(1.0, served_ns / greatest(1, t1 - t0))) AS share
                        FROM spans, bounds WHERE served_ns IS NOT NULL GROUP BY instance)
                    """
                    )
                )
                out.append(float(row[0]) if row and row[0] else None)
            if out[0] is not None and out[1] is not None:
                return SidePair(out[0], out[1])
        return self.series_count("running_requests")

    def counter_delta(self, signal: str) -> SidePair:
        """Increase of a counter within each window, summed over series (resets handled)."""
        return self._memo(("delta", signal), lambda: self._counter_delta(signal))

    def _counter_delta(self, signal: str) -> SidePair:
        """Uncached :meth:`counter_delta`."""
        name = self.name_for(signal)
        if name is None:
            return SidePair(None, None)
        out: list[float | None] = []
        for side in SIDES:
            row = fetch_one(self._con.execute(f"SELECT sum(inc) FROM {self._increments_sql(side, name)}"))
            out.append(None if row is None or row[0] is None else float(row[0]))
        return SidePair(out[0], out[1])

    def _increments_sql(self, side: str, name: str, *, histogram: bool = False) -> str:
        """:func:`~sre_agent.analysis.metric_sql.increments_sql` of one side's points of ``name``."""
        return increments_sql(self._where(side, name), histogram=histogram)

    def counter_delta_by_replica(self, signal: str, side: str = "candidate") -> dict[tuple[str, str], float]:
        """:meth:`counter_delta` of one side per replica, keyed by (attribute, value).

        The replica is named by ``host.name``, else ``service.instance.id``, as the metric
        points carry them; points naming neither are left out. Empty when the signal is absent.
        """
        rows = self._by_replica(signal, side, "sum(inc)")
        return {(str(k), str(v)): float(n or 0.0) for k, v, n in rows}

    def histogram_by_replica(self, signal: str, side: str) -> dict[tuple[str, str], tuple[float, int]]:
        """Sum and count of a histogram metric's observations within one side's window, per replica.

        Keyed by (attribute, value) as :meth:`counter_delta_by_replica`; increments as
        :meth:`histogram` takes them. Empty when the signal is absent.
        """
        rows = self._by_replica(signal, side, "sum(inc_sum), sum(inc)", histogram=True)
        return {(str(k), str(v)): (float(total or 0.0), int(n or 0)) for k, v, total, n in rows}

    def _by_replica(self, signal: str, side: str, sums: str, *, histogram: bool = False) -> list[tuple[Any, ...]]:
        """Rows ``(attribute, replica, *sums)`` over :meth:`_increments_sql`; empty when the signal is absent."""
        name = self.name_for(signal)
        if name is None:
            return []
        increments = self._increments_sql(side, name, histogram=histogram)
        rows: list[tuple[Any, ...]] = self._con.execute(
            f"SELECT {REPLICA_KEY}, {sums} FROM {increments} WHERE {REPLICA} IS NOT NULL GROUP BY ALL"
        ).fetchall()
        return rows

    def counter_rate(self, signal: str) -> SidePair:
        """:meth:`counter_delta` per second of window."""
        delta = self.counter_delta(signal)
        b, c = self._sides["baseline"].seconds, self._sides["candidate"].seconds
        return SidePair(
            None if delta.baseline is None else delta.baseline / b,
            None if delta.candidate is None else delta.candidate / c,
        )

    def finished_requests(self) -> SidePair:
        """Requests that finished within each window: the count of the e2e (else TTFT) latency histogram.

        The engine observes one value per finished request, so this counts requests when no
        request spans do; ``None`` for a side without that histogram.
        """
        found = self._finished_histograms()
        return SidePair(None, None) if found is None else SidePair(float(found[0].count), float(found[1].count))

    def _finished_histograms(self) -> tuple[HistogramDelta, HistogramDelta] | None:
        """Both sides' e2e (else TTFT) latency histograms, the first with observations on both sides."""
        for signal in ("e2e_seconds", "ttft_seconds"):
            hist = self.histogram(signal)
            b, c = hist["baseline"], hist["candidate"]
            if b is not None and c is not None and b.count and c.count:
                return b, c
        return None

    def finished_per_block(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Requests finished per scrape interval on each side (the histogram of :meth:`finished_requests`).

        Empty intervals included: how unevenly a window's requests came is what they measure.
        ``None`` where :meth:`finished_requests` has no histogram or a side has no time blocks.
        """
        found = self._finished_histograms()
        if found is None or not (found[0].blocks and found[1].blocks):
            return None
        b, c = found
        return tuple(sum(x) for x in b.blocks), tuple(sum(x) for x in c.blocks)

    def gauge_change(self, signal: str) -> SidePair:
        """Each side's change of a gauge over its window: per series, its last value minus its first, summed.

        For the waiting gauge this is how many more requests queued at the window's end than at
        its start, so arrivals = finished requests + that change (+ the running gauge's, bounded
        by the engines' slots); ``None`` for a side without the gauge.
        """
        change = (
            "SELECT sum(last_v - first_v) FROM (SELECT arg_max(value, time_ns) AS last_v, arg_min(value, time_ns) "
            "AS first_v FROM metric_points WHERE {} AND isfinite(value) GROUP BY series_key)"
        )
        return self._memo(("gauge_change", signal), lambda: self._scalar_per_side(signal, change.format))

    def tokens_per_request(self, done: SidePair | None = None, cached_share: SidePair | None = None) -> SidePair:
        """Prompt + generation tokens (counter deltas) per request on each side.

        ``cached_share``: the share of prompt tokens served from the prefix cache per side (a
        side's ``None`` counts as 0); those are left out, giving the tokens each request computed
        and holds on its own.

        ``done`` is the requests to divide by, by default :meth:`finished_requests` (the counters
        count the tokens of the requests the engine worked on in the window); ``None`` for a
        side where a counter or the count is missing.
        """
        done = self.finished_requests() if done is None else done
        prompt = self.counter_delta("prompt_tokens")
        generated = self.counter_delta("generation_tokens")
        cached = cached_share or SidePair(None, None)
        values = [
            (p * (1.0 - (h or 0.0)) + g) / n if p is not None and g is not None and n else None
            for p, g, n, h in zip(
                (prompt.baseline, prompt.candidate),
                (generated.baseline, generated.candidate),
                (done.baseline, done.candidate),
                (cached.baseline, cached.candidate),
                strict=True,
            )
        ]
        return SidePair(values[0], values[1])

    def histogram(self, signal: str) -> dict[str, HistogramDelta | None]:
        """side -> observations of a histogram metric that arrived within the window."""
        name = self.name_for(signal)
        key = ("hist", signal)
        if key in self._cache:
            cached: dict[str, HistogramDelta | None] = self._cache[key]
            return cached
        out: dict[str, HistogramDelta | None] = {"baseline": None, "candidate": None}
        if name is not None:
            for side in SIDES:
                out[side] = self._histogram_delta(side, name)
        self._cache[key] = out
        return out

    def _histogram_delta(self, side: str, name: str) -> HistogramDelta | None:
        rows = self._con.execute(
            f"""
            SELECT series_key, temporality, bounds, bucket_counts, sum, time_ns FROM metric_points
            WHERE {self._where(side, name)} AND bucket_counts IS NOT NULL ORDER BY series_key, time_ns
            """
        ).fetchall()
        increments: list[tuple[int, list[int]]] = []  # (scrape time, counts) for the time blocks
        bounds: tuple[float, ...] | None = None
        counts: list[float] = []
        total = 0.0
        prev_key: str | None = None
        prev: tuple[list[int], float] | None = None
        for series, temporality, raw_bounds, bc, s, time_ns in rows:
            b = tuple(float(x) for x in (raw_bounds or ()))
            if bounds is None:
                bounds, counts = b, [0.0] * (len(b) + 1)
            if b != bounds or len(bc) != len(counts):
                continue  # a series with other bounds cannot be merged; skip it
            if series != prev_key:
                prev_key, prev = series, None
            cur = [int(x or 0) for x in bc]
            if temporality == "delta":
                inc, inc_sum = cur, float(s or 0.0)
            elif prev is None:
                prev = (cur, float(s or 0.0))
                continue
            elif sum(cur) >= sum(prev[0]):
                inc = [max(0, a - p) for a, p in zip(cur, prev[0], strict=True)]
                inc_sum = float(s or 0.0) - prev[1]
            else:  # reset
                inc, inc_sum = cur, float(s or 0.0)
            prev = (cur, float(s or 0.0))
            counts = [a + x for a, x in zip(counts, inc, strict=True)]
            total += inc_sum
            increments.append((int(time_ns), inc))
        if bounds is None or sum(counts) == 0:
            return None
        return HistogramDelta(bounds, tuple(int(c) for c in counts), total, time_blocks(increments, len(counts)))

    def histogram_quantile(self, signal: str, q: float) -> SidePair:
        """Quantile ``q`` of a histogram metric on each side (seconds for latency histograms)."""
        h = self.histogram(signal)
        return SidePair(
            None if h["baseline"] is None else h["baseline"].quantile(q),
            None if h["candidate"] is None else h["candidate"].quantile(q),
        )

    def histogram_mean(self, signal: str) -> SidePair:
        """Mean observation of a histogram metric on each side."""
        h = self.histogram(signal)
        return SidePair(
            None if h["baseline"] is None else h["baseline"].mean,
            None if h["candidate"] is None else h["candidate"].mean,
        )
