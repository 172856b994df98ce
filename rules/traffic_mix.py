"""Traffic mix: would the baseline have been as slow with the candidate's requests?

Mechanism: latency depends on what is asked (prompt and output lengths,
model, tenant, route), so a change in the request mix moves the quantiles
even when the serving stack is unchanged. DiNardo-Fortin-Lemieux
reweighting answers the counterfactual: weight each baseline request by
P(cell | candidate) / P(cell | baseline), where a cell combines input- and
output-length buckets (powers of two) and the categorical request attributes
whose shares moved, and read the reweighted baseline's quantile. The part of
the change it reproduces is the *composition* effect (the mix); the rest is
the *structure* effect (the stack got slower for the same requests).

Confidence grows with how far the mix moved beyond chance: two samples of one
mix differ over many cells too (the expected total variation of two samples of
the pooled requests, estimated by shuffling the side labels), and only the distance beyond that
counts; no finding when the mix moved no more than that.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from sre_agent.analysis.rules_api import Evidence, Finding, Regression
from sre_agent.rules._mechanism import SERVING_DIMENSIONS

#: Total-variation distance of a categorical attribute's shares that counts as a mix shift.
MIN_SHIFT = 0.03
#: Most categorical covariates combined with the length buckets (more cells = noisier weights).
MAX_CATEGORICAL = 2
#: Side-label shuffles averaged for the distance two samples of one mix have by chance.
NULL_DRAWS = 20
#: Cap on one baseline request's weight, so a rare cell cannot dominate.
MAX_WEIGHT = 25.0
_COLUMN_OF = {"trace": "trace_s", "e2e": "e2e_s", "ttft": "ttft_s", "tpot": "tpot_s", "itl": "tpot_s"}


def _weighted_quantile(values: pl.Series, weights: pl.Series, q: float) -> float:
    frame = pl.DataFrame({"v": values, "w": weights}).sort("v")
    cum = frame["w"].cum_sum()
    total = float(cum[-1])
    idx = int(cum.search_sorted(q * total, side="left"))
    return float(frame["v"][min(idx, frame.height - 1)])


def _chance_distance(cells: pl.DataFrame, n_b: int, n_c: int) -> float:
    """Mean total variation between the sides when the side labels are shuffled.

    What two samples of one mix differ by at these sample sizes and cells (a permutation
    null: exact in expectation however sparse the cells, unlike a normal approximation).
    Shuffling labels deals each cell's pooled requests between the sides hypergeometrically,
    so the draws are made on the cell counts directly. Seeded, so a diagnosis is reproducible.
    """
    pooled = (cells["nb"] + cells["nc"]).to_numpy().astype(np.int64)
    rng = np.random.default_rng(0)
    cand = rng.multivariate_hypergeometric(pooled, n_c, size=NULL_DRAWS)
    distance = 0.5 * np.abs(cand / n_c - (pooled - cand) / n_b).sum(axis=1)
    return float(distance.mean())


def _tv_distance(frame: pl.DataFrame, key: str) -> float:
    shares = (
        frame.group_by("side", key)
        .len()
        .with_columns((pl.col("len") / pl.col("len").sum().over("side")).alias("share"))
        .pivot(on="side", index=key, values="share")
        .fill_null(0.0)
    )
    if "baseline" not in shares.columns or "candidate" not in shares.columns:
        return 0.0
    return 0.5 * float((shares["candidate"] - shares["baseline"]).abs().sum())


def traffic_mix(regression: Regression, requests: pl.LazyFrame, dimensions: list[str]) -> Finding | None:
    """A ``traffic_mix`` finding with the share of the headline change the reweighted baseline reproduces."""
    if not regression.significant:
        return None
    col = _COLUMN_OF.get(regression.metric)
    if col is None or col not in requests.collect_schema().names():
        return None  # e.g. a trace headline from the gateway's root spans alone: no per-request mix to weigh
    q = regression.quantile
    frame = (
        requests.filter(pl.col(col).is_not_null())
        .with_columns(
            (pl.col("input_tokens").fill_null(0) + 1).log(2).floor().cast(pl.Int32).alias("_in"),
            (pl.col("output_tokens").fill_null(0) + 1).log(2).floor().cast(pl.Int32).alias("_out"),
        )
        .collect()
    )
    base, cand = frame.filter(pl.col("side") == "baseline"), frame.filter(pl.col("side") == "candidate")
    if base.height < 200 or cand.height < 200:
        return None
    request_dims = [d for d in dimensions if d in frame.columns and not d.startswith(SERVING_DIMENSIONS)]
    shifts = sorted(((_tv_distance(frame, d), d) for d in request_dims), reverse=True)
    categorical = [d for tv, d in shifts[:MAX_CATEGORICAL] if tv >= MIN_SHIFT]
    covariates = ["_in", "_out", *categorical]
    frame = frame.with_columns(
        pl.concat_str([pl.col(c).cast(pl.String).fill_null("∅") for c in covariates], separator="|").alias("_cell")
    )
    # Sorted: group_by yields the cells in any order, and the seeded chance draws follow that order.
    cells = (
        frame.group_by("_cell")
        .agg((pl.col("side") == "baseline").sum().alias("nb"), (pl.col("side") == "candidate").sum().alias("nc"))
        .sort("_cell")
    )
    n_b, n_c = base.height, cand.height
    cells = cells.with_columns(((pl.col("nc") / n_c) / (pl.col("nb") / n_b)).clip(upper_bound=MAX_WEIGHT).alias("w"))
    weighted = frame.filter(pl.col("side") == "baseline").join(cells.select("_cell", "w"), on="_cell", how="left")
    weighted = _new_values_by_length(frame, cells, weighted, n_b, n_c) if categorical else weighted
    unmatched = _unmatched(frame, cells, n_c, bool(categorical))
    tv_cells = 0.5 * float(((cells["nc"] / n_c) - (cells["nb"] / n_b)).abs().sum())
    # Two samples of one mix differ too: over many cells the expected distance is far from 0
    # (~0.26 for 400 requests a side in ~40 cells). Only the distance beyond it is a shift.
    tv_null = _chance_distance(cells, n_b, n_c)

    base_q = float(base[col].quantile(q, interpolation="linear") or 0.0)
    cand_q = float(cand[col].quantile(q, interpolation="linear") or 0.0)
    values, weights = weighted[col], weighted["w"].fill_null(0.0)
    if unmatched > 0.01:
        # Requests longer (or shorter) than anything the baseline served have no twin to reweight;
        # their baseline-stack latency is extrapolated from the baseline's cost per token instead.
        orphans = _extrapolated(frame, base, col, n_b, n_c, bool(categorical))
        values = pl.concat([values, orphans["v"]])
        weights = pl.concat([weights, orphans["w"]])
    counterfactual = _weighted_quantile(values, weights, q)
    change = cand_q - base_q
    if change <= 0:
        return None
    explained = (counterfactual - base_q) / change
    if explained <= 0.05:
        return None
    w = weighted["w"].fill_null(0.0)
    ess = float(w.sum()) ** 2 / max(float((w * w).sum()), 1e-12)  # Kish effective sample size
    # Sure of a mix effect when the mix really moved, the weights are not degenerate, and
    # the candidate's requests mostly fall in cells the baseline had.
    if tv_cells <= tv_null:
        return None  # the mix moved no more than two samples of one mix do: what it "reproduces" is noise
    confidence = min(1.0, max(0.0, tv_cells - tv_null) / 0.15) * (ess / (ess + 300.0)) * (1.0 - unmatched)
    label = f"{regression.metric} p{round(q * 100)}"
    evidence = [
        Evidence(
            f"{label}_counterfactual_s",
            round(base_q, 6),
            round(counterfactual, 6),
            f"baseline reweighted to the candidate's mix (candidate: {cand_q:.4g} s)",
        ),
        Evidence(
            "mix_shift_tv",
            round(tv_null, 4),
            round(tv_cells, 4),
            f"total variation over cells of {', '.join(covariates)} (baseline column: expected by chance)",
        ),
    ]
    for name, expr in (("input_tokens_mean", "input_tokens"), ("output_tokens_mean", "output_tokens")):
        evidence.append(Evidence(name, _mean(base, expr), _mean(cand, expr), ""))
    evidence.extend(
        Evidence(f"share_shift:{d}", None, round(tv, 4), "total variation of this attribute's shares")
        for tv, d in shifts[:3]
        if tv >= MIN_SHIFT
    )
    if unmatched > 0.01:
        evidence.append(
            Evidence("unmatched_share", 0.0, round(unmatched, 4), "candidate requests in cells unseen before")
        )
    return Finding(
        cause="traffic_mix",
        title=f"The request mix changed: the baseline reweighted to the candidate's mix reproduces "
        f"{min(explained, 1.0):.0%} of the {label} change",
        explained=min(1.0, explained),
        confidence=confidence,
        evidence=tuple(evidence),
        next_check="replay the baseline version with the candidate's request mix (lengths, models, tenants); "
        "if it is as slow, the deploy is not the cause",
    )


def _new_values_by_length(
    frame: pl.DataFrame, cells: pl.DataFrame, weighted: pl.DataFrame, n_b: int, n_c: int
) -> pl.DataFrame:
    """Add the candidate requests of cells the baseline never had (a new tenant, route or model) by length.

    A request of a category the baseline did not serve has no baseline twin in its full cell, so
    DFL weights would drop it and the counterfactual would miss exactly the new traffic. Its best
    stand-in is the baseline's requests of the same input and output lengths: each baseline request
    in length cell L gains ``(new candidate requests in L / n_c) / (baseline requests in L / n_b)``.
    """
    unseen = cells.filter(pl.col("nb") == 0)["_cell"]
    if unseen.len() == 0:
        return weighted
    length_cell = pl.concat_str([pl.col("_in").cast(pl.String), pl.col("_out").cast(pl.String)], separator="|")
    new_by_length = (
        frame.filter((pl.col("side") == "candidate") & pl.col("_cell").is_in(unseen.implode()))
        .group_by(length_cell.alias("_len"))
        .agg(pl.len().alias("nc_new"))
    )
    base_by_length = weighted.group_by(length_cell.alias("_len")).agg(pl.len().alias("nb_len"))
    extra = new_by_length.join(base_by_length, on="_len", how="inner").with_columns(
        ((pl.col("nc_new") / n_c) / (pl.col("nb_len") / n_b)).alias("w_new")
    )
    return (
        weighted.with_columns(length_cell.alias("_len"))
        .join(extra.select("_len", "w_new"), on="_len", how="left")
        .with_columns(
            (pl.col("w").fill_null(0.0) + pl.col("w_new").fill_null(0.0)).clip(upper_bound=MAX_WEIGHT).alias("w")
        )
        .drop("_len", "w_new")
    )


#: Which token count a latency scales with, for extrapolating beyond the baseline's lengths.
_SCALES_WITH = {"ttft_s": "input_tokens", "e2e_s": "output_tokens"}


def _orphan_filter(frame: pl.DataFrame, by_length: bool) -> pl.Expr:
    """Candidate requests without a baseline twin: in no baseline cell (by length when categories are new)."""
    key = "_cell"
    if by_length:
        key = "_len"
    base_keys = frame.filter(pl.col("side") == "baseline")[key].unique()
    return (pl.col("side") == "candidate") & ~pl.col(key).is_in(base_keys.implode())


def _extrapolated(  # noqa: PLR0917 - the reweighting's own state, passed once
    frame: pl.DataFrame, base: pl.DataFrame, col: str, n_b: int, n_c: int, by_length: bool
) -> pl.DataFrame:
    """Baseline-stack values for candidate requests with no twin: the baseline's latency per token x their tokens.

    The rate is the baseline's median of ``latency / tokens`` over its requests in the two length
    buckets nearest the orphan's (per token of input for TTFT, of output for e2e); TPOT does not
    scale with length and keeps the baseline's median. Each orphan weighs ``n_b / n_c``, as a
    candidate request does in the reweighted baseline.
    """
    length_cell = pl.concat_str([pl.col("_in").cast(pl.String), pl.col("_out").cast(pl.String)], separator="|")
    frame = frame.with_columns(length_cell.alias("_len"))
    orphans = frame.filter(_orphan_filter(frame, by_length))
    tokens = _SCALES_WITH.get(col)
    if orphans.height == 0:
        return pl.DataFrame({"v": [], "w": []}, schema={"v": pl.Float64, "w": pl.Float64})
    if tokens is None:
        value = float(base[col].median() or 0.0)  # type: ignore[arg-type]
        v = pl.Series("v", [value] * orphans.height, dtype=pl.Float64)
    else:
        bucket = "_in" if tokens == "input_tokens" else "_out"
        per_token = base.filter(pl.col(tokens) > 0).with_columns((pl.col(col) / pl.col(tokens)).alias("_r"))
        rates = {}
        for b in orphans[bucket].unique().to_list():
            near = per_token.filter((pl.col(bucket) - b).abs() <= 1)
            if near.height < 20:  # too few neighbours: the baseline's largest requests stand in
                near = per_token.sort(tokens).tail(max(20, per_token.height // 10))
            rates[b] = float(near["_r"].median() or 0.0)  # type: ignore[arg-type]
        v = orphans.select(
            (pl.col(tokens).cast(pl.Float64) * pl.col(bucket).replace_strict(rates, default=0.0)).alias("v")
        )["v"]
    return pl.DataFrame({"v": v, "w": pl.Series([n_b / n_c] * orphans.height, dtype=pl.Float64)})


def _unmatched(frame: pl.DataFrame, cells: pl.DataFrame, n_c: int, by_length: bool) -> float:
    """Share of candidate requests with no baseline twin (by full cell, or by length for unseen categories)."""
    unseen = cells.filter(pl.col("nb") == 0)["_cell"]
    if not by_length or unseen.len() == 0:
        return float(cells.filter(pl.col("nb") == 0)["nc"].sum()) / n_c
    length_cell = pl.concat_str([pl.col("_in").cast(pl.String), pl.col("_out").cast(pl.String)], separator="|")
    base_lengths = frame.filter(pl.col("side") == "baseline").select(length_cell.alias("_len")).unique()["_len"]
    orphans = frame.filter(
        (pl.col("side") == "candidate")
        & pl.col("_cell").is_in(unseen.implode())
        & ~length_cell.is_in(base_lengths.implode())
    )
    return orphans.height / n_c


def _mean(frame: pl.DataFrame, column: str) -> float | None:
    value = frame[column].mean()
    return round(float(value), 2) if isinstance(value, int | float) and math.isfinite(value) else None
