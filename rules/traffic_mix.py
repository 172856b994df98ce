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
"""

from __future__ import annotations

import math

import polars as pl

from sre_agent.rules_api import Evidence, Finding, Regression

#: Attributes that describe where a request was served, not what was asked: never mix covariates.
SERVING_DIMENSIONS = ("host.", "k8s.", "service.", "server.", "container.", "process.", "telemetry.", "cloud.")
#: Total-variation distance of a categorical attribute's shares that counts as a mix shift.
MIN_SHIFT = 0.03
#: Most categorical covariates combined with the length buckets (more cells = noisier weights).
MAX_CATEGORICAL = 2
#: Cap on one baseline request's weight, so a rare cell cannot dominate.
MAX_WEIGHT = 25.0
_COLUMN_OF = {"e2e": "e2e_s", "ttft": "ttft_s", "tpot": "tpot_s", "itl": "tpot_s"}


def _weighted_quantile(values: pl.Series, weights: pl.Series, q: float) -> float:
    frame = pl.DataFrame({"v": values, "w": weights}).sort("v")
    cum = frame["w"].cum_sum()
    total = float(cum[-1])
    idx = int(cum.search_sorted(q * total, side="left"))
    return float(frame["v"][min(idx, frame.height - 1)])


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
    if col is None:
        return None
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
    cells = frame.group_by("_cell").agg(
        (pl.col("side") == "baseline").sum().alias("nb"), (pl.col("side") == "candidate").sum().alias("nc")
    )
    n_b, n_c = base.height, cand.height
    cells = cells.with_columns(((pl.col("nc") / n_c) / (pl.col("nb") / n_b)).clip(upper_bound=MAX_WEIGHT).alias("w"))
    weighted = frame.filter(pl.col("side") == "baseline").join(cells.select("_cell", "w"), on="_cell", how="left")
    unmatched = float(cells.filter(pl.col("nb") == 0)["nc"].sum()) / n_c
    tv_cells = 0.5 * float(((cells["nc"] / n_c) - (cells["nb"] / n_b)).abs().sum())

    base_q = float(base[col].quantile(q, interpolation="linear") or 0.0)
    cand_q = float(cand[col].quantile(q, interpolation="linear") or 0.0)
    counterfactual = _weighted_quantile(weighted[col], weighted["w"].fill_null(0.0), q)
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
    confidence = min(1.0, tv_cells / 0.15) * (ess / (ess + 300.0)) * (1.0 - unmatched)
    label = f"{regression.metric} p{round(q * 100)}"
    evidence = [
        Evidence(
            f"{label}_counterfactual_s",
            round(base_q, 6),
            round(counterfactual, 6),
            f"baseline reweighted to the candidate's mix (candidate: {cand_q:.4g} s)",
        ),
        Evidence("mix_shift_tv", 0.0, round(tv_cells, 4), f"total variation over cells of {', '.join(covariates)}"),
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


def _mean(frame: pl.DataFrame, column: str) -> float | None:
    value = frame[column].mean()
    return round(float(value), 2) if isinstance(value, int | float) and math.isfinite(value) else None
