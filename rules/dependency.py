"""A span outside the engine got slower (retrieval, tool, guardrail, tokenizer, network).

Mechanism: a request's trace is the gateway's own work, the engine call(s)
and the calls to dependencies. When one dependency (a span group: service,
name, kind) slows down, every trace that calls it is longer by its calls
per trace x the shift of its mean duration, whatever the engine does.

Signals: every non-engine span that is neither a trace root nor in a group
of engine-call wrappers (gateway attempt spans, failed ones included),
grouped by (service, name, kind);
per side its mean duration with a cluster-robust SE over time slices, its
p99 and its calls per logical request (root spans). A group counts as shifted
when its mean rose by 20 % and 5 ms or more with z >= 2. Its scope is the
one attribute value (tenant.id, route, ...) holding >= 70 % of the shift
and 20 points more of the shift than of the traffic, found on the traces of the sampled requests.

``explained`` (0..1): in trace terms. The tail of root-span durations (at
the headline quantile) is compared between sides; the dependency time of
tail traces rose by D seconds while the tail's trace time rose by T, so all
dependencies explain ``D / T``; the shifted group gets its part of that,
``calls per request x mean shift`` over the sum of every group's positive
``calls x shift``. Without root spans: the group's added seconds per request
over the headline's excess.

``explained`` is 0 when the headline is the error rate (no latency mechanism
accounts for failed requests).

``confidence``: significance of the group's z x ``min(1, relative rise / 0.5)``.

Quiet when no group shifted; :class:`RuleSkipped` without non-engine spans,
or when the windows overlap (version mode: sides cannot be told by time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import polars as pl

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.rules_api import SIDES, Evidence, Finding, Regression, RuleSkipped
from sre_agent.rules._mechanism import (
    clip01,
    confined_slice,
    latency_share,
    ratio_estimate,
    rnd,
    side,
    significance,
    windows_overlap,
    z_change,
)

#: Smallest relative rise of a group's mean duration.
MIN_RISE: Final[float] = 0.20
#: Smallest absolute rise of a group's mean duration, seconds.
MIN_RISE_S: Final[float] = 0.005
#: Fewest spans per side in a group.
MIN_SPANS: Final[int] = 20
#: Relative rise counted as unmistakable.
FULL_RISE: Final[float] = 0.5
#: A value every caller of a group shares is its scope when at most this share of all requests carries it.
CALLER_SHARE: Final[float] = 0.8
#: Dimensions named first when several values select the same requests: the owner of the traffic.
SCOPE_PRIORITY: Final[tuple[str, ...]] = ("tenant.id", "http.route", "gen_ai.request.model")


@dataclass(frozen=True)
class _Shift:
    """One span group whose mean duration rose."""

    service: str
    name: str
    kind: str
    mean_b: float
    mean_c: float
    spans: tuple[int, int]
    calls: float
    z: float

    @property
    def rise(self) -> float:
        return self.mean_c / self.mean_b - 1.0 if self.mean_b > 0 else float("inf")

    @property
    def added(self) -> float:
        """Seconds added per logical request."""
        return self.calls * (self.mean_c - self.mean_b)


def dependency(comparison: Comparison, regression: Regression, dimensions: list[str]) -> list[Finding] | None:
    """A ``dependency`` finding per non-engine span group whose duration rose (see module docstring)."""
    if not comparison.has_other_spans:
        raise RuleSkipped("no spans outside the engine (no gateway or dependency instrumentation)")
    if windows_overlap(comparison):
        raise RuleSkipped("the windows overlap (version comparison): dependency spans cannot be assigned a side")
    spans = comparison.other_spans
    slices = spans.dependency_groups()
    if slices.height == 0:
        raise RuleSkipped("no dependency spans (only gateway roots and engine-call wrappers)")
    root_n = spans.root_counts()
    p99 = spans.group_p99()
    shifted: list[_Shift] = []
    positive_total = 0.0
    for key, group in slices.group_by("service_name", "name", "kind"):
        # Rows are slices (span counts and sums): the floor of one observation's worth is per span.
        eb = ratio_estimate(side(group, "baseline"), pl.col("total_s"), pl.col("n"), observations=pl.col("n"))
        ec = ratio_estimate(side(group, "candidate"), pl.col("total_s"), pl.col("n"), observations=pl.col("n"))
        n_b, n_c = int(side(group, "baseline")["n"].sum()), int(side(group, "candidate")["n"].sum())
        if eb.value is None or ec.value is None or n_b < MIN_SPANS or n_c < MIN_SPANS:
            continue
        calls = n_c / root_n["candidate"] if root_n.get("candidate") else 1.0
        shift = _Shift(str(key[0]), str(key[1]), str(key[2]), eb.value, ec.value, (n_b, n_c), calls, z_change(eb, ec))
        positive_total += max(0.0, shift.added)
        if shift.z >= 2.0 and shift.rise >= MIN_RISE and shift.mean_c - shift.mean_b >= MIN_RISE_S:
            shifted.append(shift)
    if not shifted:
        return None
    # A headline on dependency time itself is all dependency time; otherwise the dependencies'
    # share of the trace tail excess bounds what any one group can explain.
    all_deps = (
        (1.0, regression.quantile)
        if regression.metric == "dependency"
        else (_dependency_share_of_tail(comparison, regression))
    )
    findings = []
    for shift in sorted(shifted, key=lambda s: -s.added):
        service, name, kind, z, rise = shift.service, shift.name, shift.kind, shift.z, shift.rise
        mean_b, mean_c, added = shift.mean_b, shift.mean_c, shift.added
        group_p99 = p99.filter(
            (pl.col("service_name") == service) & (pl.col("name") == name) & (pl.col("kind") == kind)
        )
        p99_by_side = {r["side"]: r["p99_s"] for r in group_p99.to_dicts()}
        share_of_deps = added / positive_total if positive_total > 0 else 0.0
        if all_deps is not None:
            explained = clip01(all_deps[0]) * share_of_deps
            detail = (
                "the headline is dependency time"
                if regression.metric == "dependency"
                else f"dependencies hold {all_deps[0]:.0%} of the trace p{round(all_deps[1] * 100)} tail excess"
            )
        else:
            excess = regression.excess or 0.0
            explained = clip01(added / excess) if excess > 0 else 0.0
            detail = "no root spans: added seconds per request over the headline excess"
        evidence = [
            Evidence(f"{name}_mean_s", rnd(mean_b, 5), rnd(mean_c, 5),
                     f"{service}/{kind}; {shift.spans[0]} -> {shift.spans[1]} spans; z = {z:.1f}"),
            Evidence(f"{name}_p99_s", rnd(p99_by_side.get("baseline"), 5), rnd(p99_by_side.get("candidate"), 5),
                     "99th percentile of the span duration"),
            Evidence("added_s_per_request", 0.0, rnd(added, 5),
                     f"{shift.calls:.2f} calls per request x mean shift; {share_of_deps:.0%} of all dependency "
                     f"shifts; {detail}"),
        ]  # fmt: skip
        scope = _scope(comparison, (service, name, kind), dimensions)
        named = ", ".join(f"{k}={v}" for k, v in scope[0].items()) if scope else ""
        if scope is not None:
            evidence.append(Evidence(f"shift_share[{named}]", None, rnd(scope[1]),
                                     f"share of the added time; {scope[2]:.0%} of the traffic"))  # fmt: skip
        where = f" for {named}" if scope else ""
        findings.append(
            Finding(
                cause="dependency",
                title=f"Dependency span {name!r} ({service}) got {rise:.0%} slower{where}: "
                f"{mean_b * 1e3:.1f} -> {mean_c * 1e3:.1f} ms mean",
                explained=latency_share(regression, explained),
                confidence=significance(z) * min(1.0, rise / FULL_RISE),
                stage="dependency",
                scope=dict(scope[0]) if scope else {},
                evidence=tuple(evidence),
                next_check=f"open the slowest candidate traces and compare {name!r} spans with the baseline's "
                f"(by {', '.join(dimensions[:3]) or 'attribute'}); check {service}'s own deploys, "
                "saturation and timeouts",
            )
        )
    return findings


def _dependency_share_of_tail(comparison: Comparison, regression: Regression) -> tuple[float, float] | None:
    """(tail excess of dependency time / tail excess of trace time, quantile), from the sampled traces."""
    traces = comparison.traces.filter(pl.col("trace_s").is_not_null())
    q = regression.quantile if regression.quantile >= 0.5 else 0.9
    means: dict[str, tuple[float, float]] = {}
    for s in SIDES:
        part = side(traces, s)
        if part.height < 20:
            return None
        threshold = part["trace_s"].quantile(q, interpolation="lower")
        tail = part.filter(pl.col("trace_s") >= threshold)
        means[s] = (float(tail["trace_s"].mean()), float(tail["dependency_s"].fill_null(0).mean()))  # type: ignore[arg-type]
    trace_excess = means["candidate"][0] - means["baseline"][0]
    if trace_excess <= 0:
        return 0.0, q
    return (means["candidate"][1] - means["baseline"][1]) / trace_excess, q


def _scope(
    comparison: Comparison, group: tuple[str, str, str], dimensions: list[str]
) -> tuple[dict[str, str], float, float] | None:
    """The slice confining the group's shift (names, share of the shift, share of the traffic), or ``None``.

    Found on the sampled requests' lifted dimensions. Without engine spans (a gateway's
    spans and the engines' metrics) there are no sampled requests; the root spans' own
    dimensions stand for them.
    """
    if comparison.requests.height:
        dims = [d for d in dimensions if d in comparison.requests.columns]
        per_trace = comparison.requests.select("trace_id", *dims).unique("trace_id")
    else:
        per_trace = comparison.other_spans.root_dimensions.unique("trace_id")
        dims = [d for d in per_trace.columns if d not in {"trace_id", "side"}]
    if not dims:
        return None
    spans = comparison.other_spans.group_spans(*group)
    joined = spans.join(per_trace, on="trace_id", how="inner")
    if joined.height == 0:
        return None
    # A value confining the shift within the group's own spans is the tighter scope; only when
    # the spans show no such variation does the group's single caller slice stand for it.
    within = confined_slice(joined, dims, pl.col("duration_s"), pl.lit(1.0), direction=1, rest_moved_less=True)
    if within is not None:
        return {within[0]: within[1]}, within[2], within[3]
    return _caller_slice(joined, per_trace, dims)


def _caller_slice(
    joined: pl.DataFrame, per_trace: pl.DataFrame, dims: list[str]
) -> tuple[dict[str, str], float, float] | None:
    """The values every caller of the group shares, when they are a slice of the traffic.

    A dependency only some requests call (retrieval behind a RAG route) holds its whole
    shift in those requests, but its spans show no variation to split. If every span of
    the group carries the same value of a dimension and that value is at most
    ``CALLER_SHARE`` of all requests, the slowdown reaches that slice only. The value
    holding the least traffic is the tightest statement and is named first; an owner
    (``SCOPE_PRIORITY``: tenant, route, model) holding more is named beside it, since
    the data cannot tell "retrieval slowed" from "retrieval slowed for the one tenant
    that calls it". Values aliased with each other (the tenant, its route, its
    ``max_tokens``, holding the same requests) cannot be told apart by any statistic:
    only the first in priority order is named.
    """
    ordered = [d for d in SCOPE_PRIORITY if d in dims] + [d for d in dims if d not in SCOPE_PRIORITY]
    found: list[tuple[int, str, str]] = []
    for dim in ordered:
        values = joined[dim].cast(pl.String).drop_nulls().unique()
        if values.len() != 1 or joined[dim].null_count():
            continue
        value = str(values[0])
        holders = int((per_trace[dim].cast(pl.String) == value).sum())
        if holders <= CALLER_SHARE * max(1, per_trace.height):
            found.append((holders, dim, value))
    if not found:
        return None
    # sorted() keeps the priority order among equal counts.
    tightest, *rest = sorted(found, key=lambda f: f[0])
    names = {tightest[1]: tightest[2]}
    counts = {tightest[0]}
    for holders, dim, value in rest:
        if dim in SCOPE_PRIORITY and holders not in counts:
            names[dim] = value
            counts.add(holders)
    return names, 1.0, tightest[0] / max(1, per_trace.height)
