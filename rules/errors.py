"""The error, abort or finish-reason mix changed.

Mechanism: a deploy that rejects requests (a lower ``max_model_len``, a bad
route), aborts or times them out, or truncates them (``finish_reason =
length`` from a lower max-tokens default) changes what users get and what the
latency population holds: failed requests are often slow (timeouts) or
fast (early rejections), so the tail moves with them.

Signals (shares per side, each with a cluster-robust SE over time slices and
a two-sample proportion z test):

* logical requests (trace root spans): ``error_rate`` (status ERROR) and the
  share of each ``error.type``;
* engine requests: status ERROR share and the share of each finish reason
  (``length``, ``abort``, ``error``, ...); engine requests that never ran leave
  no span, so the root spans are the first source.

A category has moved when its share rose by 1 point or more, at least x1.5,
with z >= 3 (many categories are tested, so the bar is higher than 2).

``explained`` (0..1): how much of the tail is newly made of the category,
``(tail_share_c - tail_share_b) / (1 - tail_share_b)`` over requests at or
above each side's quantile (root duration for root categories, the headline
metric for engine categories); 0 when failing requests are not in the tail
(fast rejections, truncations shorten latency). When the headline is the
error rate itself (``error_rate``), ``explained`` is 1.

``confidence``: significance of z x ``min(1, rise / 0.05)``; x 0.3 when the
rise is confined to a tenant, route or model the baseline never served (those
requests' own asks made them fail or truncate: the mix changed), with a
``traffic_mix`` finding at the undamped confidence beside it (nothing else names
a failed share new traffic brought); a logical-request category is confined by
the gateway's root span attributes (requests rejected before any engine saw them); x 0.5 when the
moved category is a timeout of logical requests while no engine category
moved (the gateway's deadline cut requests the engine was serving: the
attempt policy, ``retry_amplification``, made those errors). When engine
failures rose but the logical error rate rose less (the gateway recovered
them), the engine categories' ``explained`` is scaled by the share of the
rise that reached users.
Scope: the attribute value holding >= 70 % of the rise and 20 points more
of it than of the traffic (engine categories, on the sampled requests' dimensions
other than the attributes the categories are read from; logical-request
categories, on the gateway's root span attributes other than those restating
the outcome).
When only logical requests failed more (an engine that rejects a request before
serving it leaves no span), the same test runs on the gateway's engine calls by the
host they called (``server.address``), named also by the engine's ``host.name`` /
``service.instance.id`` when a replica reports that name.

Quiet when no category moved; :class:`RuleSkipped` when neither spans nor
root spans are present.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.rules_api import SIDES, Evidence, Finding, Regression, RuleSkipped
from sre_agent.rules._mechanism import (
    MIN_BUCKET,
    SERVING_DIMENSIONS,
    clip01,
    confined_slice,
    headline_column,
    ratio_estimate,
    rnd,
    side,
    significance,
    windows_overlap,
    z_change,
)
from sre_agent.store.schema import SPAN_ATTRIBUTE_SOURCES

#: Smallest absolute rise of a share.
MIN_RISE: Final[float] = 0.01
#: Smallest relative rise of a share.
MIN_FACTOR: Final[float] = 1.5
#: z needed per category (several categories are tested at once).
MIN_Z: Final[float] = 3.0
#: Rise counted as unmistakable.
FULL_RISE: Final[float] = 0.05
#: Confidence factor for timeouts the gateway made while the engine's failures stayed flat.
GATEWAY_MADE_DAMPING: Final[float] = 0.5
#: Confidence factor when the rise is confined to requests of a slice the baseline never served.
NEW_TRAFFIC_DAMPING: Final[float] = 0.3
#: Attributes the categories are read from: a slice of one of them restates the category.
CATEGORY_SOURCES: Final[frozenset[str]] = frozenset(
    SPAN_ATTRIBUTE_SOURCES["finish_reason"] + SPAN_ATTRIBUTE_SOURCES["error_type"]
)

NEXT_CHECK: Final[str] = (
    "group the candidate's failed requests by error.type, finish reason, route and replica; diff max_model_len, "
    "max_tokens defaults, timeouts and validation in the deploy; read the engine's rejection logs"
)


def _categories(frame: pl.DataFrame, columns: dict[str, str]) -> pl.DataFrame:
    """One boolean column ``cat:<label>`` per category value seen on the candidate side."""
    out = frame
    for label, column in columns.items():
        if column == "status_code":
            out = out.with_columns((pl.col(column) == "error").fill_null(False).alias(f"cat:{label}"))
            continue
        values = side(frame, "candidate")[column].drop_nulls().unique().to_list()
        for value in values[:20]:
            out = out.with_columns((pl.col(column) == value).fill_null(False).alias(f"cat:{label}={value}"))
    return out


def _moved(frame: pl.DataFrame, duration: str, q: float, level: str) -> list[tuple[float, str, Evidence, float]]:
    """(score, category, evidence, explained) for each category whose share rose."""
    out = []
    categories = [c for c in frame.columns if c.startswith("cat:")]
    # Split once, on just the needed columns: each filter of the wide frame copies every column.
    narrow = frame.select("side", "slice", duration, *categories)
    sides = {s: side(narrow, s) for s in SIDES}
    for col in categories:
        eb = ratio_estimate(sides["baseline"], pl.col(col), pl.lit(1.0))
        ec = ratio_estimate(sides["candidate"], pl.col(col), pl.lit(1.0))
        if eb.value is None or ec.value is None or eb.n < MIN_BUCKET or ec.n < MIN_BUCKET:
            continue
        z = z_change(eb, ec)
        rise = ec.value - eb.value
        if z < MIN_Z or rise < MIN_RISE or ec.value < MIN_FACTOR * eb.value:
            continue
        tails = []
        for s in SIDES:
            part = sides[s].filter(pl.col(duration).is_not_null())
            threshold = part[duration].quantile(q, interpolation="lower")
            tail = part.filter(pl.col(duration) >= threshold)
            tails.append(float(tail[col].mean()) if tail.height else 0.0)  # type: ignore[arg-type]
        explained = clip01((tails[1] - tails[0]) / (1.0 - tails[0])) if tails[0] < 1 else 0.0
        label = col.removeprefix("cat:")
        evidence = Evidence(f"{label}_share", rnd(eb.value), rnd(ec.value),
                            f"share of {level}; z = {z:.1f}; in the p{round(q * 100)} tail {tails[0]:.1%} -> "
                            f"{tails[1]:.1%}")  # fmt: skip
        out.append((significance(z) * min(1.0, rise / FULL_RISE), label, evidence, explained))
    return out


def errors(comparison: Comparison, regression: Regression, dimensions: list[str]) -> list[Finding] | None:
    """An ``errors`` finding when an error, abort or finish-reason share rose (see module docstring)."""
    q = regression.quantile if regression.quantile >= 0.5 else 0.9
    moved: list[tuple[float, str, Evidence, float]] = []
    engine = comparison.requests
    roots_seen = False
    if comparison.has_other_spans and not windows_overlap(comparison):
        roots = comparison.other_spans.roots()
        if roots.height:
            roots_seen = True
            roots = _categories(roots, {"error_rate": "status_code", "error.type": "error_type"})
            moved += _moved(roots, "duration_s", q, "logical requests (root spans)")
    if engine.height == 0 and not roots_seen:
        raise RuleSkipped("no engine spans and no root spans to count errors on")
    scope: dict[str, str] = {}
    scope_evidence: list[Evidence] = []
    engine_moved: list[tuple[float, str, Evidence, float]] = []
    new_traffic = False
    if engine.height:
        categorised = _categories(engine, {"engine_error_rate": "status_code", "finish_reason": "finish_reason"})
        engine_moved = _moved(categorised, headline_column(regression, categorised.columns), q, "engine requests")
        if engine_moved and roots_seen:
            reached = _reached_users(roots, categorised)
            if reached is not None and reached[0] < 1.0:
                # The gateway recovered the failed engine calls (retries, fallbacks): what users
                # felt is the recovery's time, retry_amplification's mechanism, not these errors.
                engine_moved = [(m[0], m[1], m[2], m[3] * reached[0]) for m in engine_moved]
                scope_evidence.append(reached[1])
        moved += engine_moved
        if engine_moved:
            top = max(engine_moved, key=lambda m: m[0])
            # The attributes a category is read from would only restate it (finish_reasons=["length"]).
            slices = [d for d in dimensions if d not in CATEGORY_SOURCES]
            found = confined_slice(categorised, slices, pl.col(f"cat:{top[1]}"), pl.lit(1.0), direction=1)
            if found is not None:
                scope = {found[0]: found[1]}
                scope_evidence.append(Evidence(f"{top[1]}_rise_share[{found[0]}={found[1]}]", None, rnd(found[2]),
                                               f"share of the rise; {found[3]:.0%} of the traffic"))  # fmt: skip
                new_traffic = _new_traffic(categorised, found[0], found[1])
    if not moved:
        return None
    root_top = max((m for m in moved if m not in engine_moved), key=lambda m: m[0], default=None)
    if not scope and roots_seen and root_top is not None and (not engine_moved or root_top[0] >= moved[0][0]):
        # Logical requests failed more: the slice of the traffic they belong to, from the root
        # spans' own attributes (the gateway rejects some requests before any engine sees them).
        found_root = _root_slice(comparison, roots, root_top[1])
        if found_root is not None:
            scope, evidence, new_traffic = found_root
            scope_evidence.append(evidence)
    if not scope and roots_seen and len(moved) > len(engine_moved):
        # Logical requests failed more: an engine that rejects requests before serving them
        # leaves no span, but the gateway's attempt still names the replica it called.
        by_host = _failed_calls_scope(comparison)
        if by_host is not None:
            scope, evidence = by_host
            scope_evidence.append(evidence)
    moved.sort(key=lambda m: -m[0])
    confidence, label, _, _ = moved[0]
    if roots_seen and not engine_moved and any("timeout" in m[1] for m in moved):
        # Logical requests timed out while the engine's own failures did not rise: the gateway's
        # deadline cut requests the engine was still serving. Its attempt policy (per-attempt
        # timeouts and retries, retry_amplification) made these errors; they are its symptom.
        confidence *= GATEWAY_MADE_DAMPING
        scope_evidence.append(
            Evidence(
                "engine_error_share_moved", None, False,
                "timeouts made by the gateway: the engine's own error share did not rise",
            )
        )  # fmt: skip
    undamped = confidence
    if new_traffic:
        # The rise lives in requests of a tenant, route or model the baseline never served: what
        # those requests ask (answers longer than their max_tokens, prompts beyond the context)
        # made them fail or truncate, so the mix changed (traffic_mix), not the stack.
        confidence *= NEW_TRAFFIC_DAMPING
        scope_evidence.append(
            Evidence("rise_in_new_traffic", None, True, f"{_slice(scope)} served no request before the deploy")
        )
    # When the headline is the failed share itself, a moved error share is the whole regression.
    explained = 1.0 if regression.metric == "error_rate" else max(m[3] for m in moved)
    first = moved[0][2]
    finding = Finding(
        cause="errors",
        title=f"{label} share rose {_pct(first.baseline)} -> {_pct(first.candidate)}"
        + (f" ({len(moved) - 1} more categories moved)" if len(moved) > 1 else ""),
        explained=explained,
        confidence=confidence,
        stage=None,
        scope=scope,
        evidence=tuple(m[2] for m in moved[:6]) + tuple(scope_evidence),
        next_check=NEXT_CHECK,
    )
    if not new_traffic:
        return [finding]
    # The mix's finding, at the confidence the errors finding gave up: nothing else names a failed
    # share that new traffic brought (the reweighting rule reads latencies, not failures).
    mix = Finding(
        cause="traffic_mix",
        title=f"Traffic new since the deploy fails on its own asks: {_slice(scope)}, "
        f"{label} share {_pct(first.baseline)} -> {_pct(first.candidate)}",
        explained=explained,
        confidence=undamped,
        stage=None,
        scope=scope,
        evidence=finding.evidence,
        next_check="look at what the new traffic asks (prompt length against the context, max_tokens, model) "
        "and admit, reshape or reject it at the gateway",
    )
    return [mix, finding]


def _root_slice(
    comparison: Comparison, roots: pl.DataFrame, label: str
) -> tuple[dict[str, str], Evidence, bool] | None:
    """The root spans' attribute value confining a logical-request category's rise, and whether it is new.

    ``roots``: the root spans with their ``cat:`` columns; the dimensions come from the gateway's
    root spans (:attr:`OtherSpans.root_dimensions`). ``None`` when no value confines the rise.
    """
    dims = comparison.other_spans.root_dimensions
    # An attribute that restates the outcome (the response's status code, error.type) is no slice.
    columns = [
        d
        for d in dims.columns
        if d not in {"trace_id", "side"}
        and d not in CATEGORY_SOURCES
        and not d.endswith("status_code")
        and not d.startswith(SERVING_DIMENSIONS)
    ]
    if not columns or "trace_id" not in roots.columns:
        return None
    joined = roots.join(dims.drop("side").unique("trace_id"), on="trace_id", how="inner")
    found = confined_slice(joined, columns, pl.col(f"cat:{label}"), pl.lit(1.0), direction=1)
    if found is None:
        return None
    evidence = Evidence(f"{label}_rise_share[{found[0]}={found[1]}]", None, rnd(found[2]),
                        f"share of the rise among logical requests; {found[3]:.0%} of the traffic")  # fmt: skip
    return {found[0]: found[1]}, evidence, _new_traffic(joined, found[0], found[1])


def _new_traffic(frame: pl.DataFrame, dimension: str, value: str) -> bool:
    """Whether the slice ``dimension = value`` is new: the baseline has none of its requests.

    Only request attributes count (tenant, route, model): a replica new at the deploy is
    where requests were served, not what was asked.
    """
    if dimension.startswith(SERVING_DIMENSIONS) or dimension not in frame.columns:
        return False
    before = side(frame, "baseline").filter(pl.col(dimension).cast(pl.String).fill_null("(missing)") == value)
    return before.height == 0


def _slice(scope: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in scope.items())


def _failed_calls_scope(comparison: Comparison) -> tuple[dict[str, str], Evidence] | None:
    """The called host holding the failed engine calls' rise (gateway attempt spans), with evidence.

    The scope names it as ``server.address`` and, when an engine replica reports the same
    name as its ``host.name`` or ``service.instance.id``, under those too. ``None`` when
    the rise is not confined to one host (see :func:`confined_slice`).
    """
    calls = comparison.other_spans.engine_calls().filter(pl.col("target").is_not_null())
    if calls.height == 0:
        return None
    found = confined_slice(calls, ["target"], pl.col("failed"), pl.lit(1.0), direction=1)
    if found is None:
        return None
    _, host, share, traffic = found
    scope = {"server.address": host}
    requests = comparison.requests
    for attribute in ("host.name", "service.instance.id"):
        if attribute in requests.columns and (requests[attribute] == host).any():
            scope[attribute] = host
    if len(scope) == 1 and requests.height == 0:  # no engine spans: the replicas the metrics name
        named = comparison.metrics.counter_delta_by_replica("generation_tokens", "baseline")
        scope.update({attribute: value for attribute, value in named if value == host})
    evidence = Evidence(
        f"failed_call_rise_share[server.address={host}]",
        None,
        rnd(share),
        f"share of the rise in failed engine calls (gateway attempts); {traffic:.0%} of the calls",
    )
    return scope, evidence


def _reached_users(roots: pl.DataFrame, engine: pl.DataFrame) -> tuple[float, Evidence] | None:
    """Share of the engine's error-rate rise that reached logical requests (root spans), 0..1, with evidence.

    ``None`` when the engine's failed share did not rise. Both frames carry ``cat:`` columns
    from :func:`_categories` (``error_rate`` on roots, ``engine_error_rate`` on engine spans).
    """
    shares = {}
    for name, frame, col in (("root", roots, "cat:error_rate"), ("engine", engine, "cat:engine_error_rate")):
        if col not in frame.columns:
            return None
        shares[name] = [float(side(frame, s)[col].mean() or 0.0) for s in SIDES]  # type: ignore[arg-type]
    engine_rise = shares["engine"][1] - shares["engine"][0]
    if engine_rise <= 0:
        return None
    root_rise = shares["root"][1] - shares["root"][0]
    reached = clip01(root_rise / engine_rise)
    evidence = Evidence("logical_error_rate", rnd(shares["root"][0]), rnd(shares["root"][1]),
                        f"root spans; {reached:.0%} of the engine's error-rate rise reached users")  # fmt: skip
    return reached, evidence


def _pct(x: object) -> str:
    return f"{x:.1%}" if isinstance(x, float) else "n/a"
