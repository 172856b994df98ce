"""Flatten an ``ExportMetricsServiceRequest`` into canonical metric points.

One row per data point (gauge, sum, histogram, exponential histogram,
summary), the metric name normalised by
:func:`sre_agent.store.schema.canonical_metric_name` so that ``vllm:x_total`` and
``vllm:x`` (and old vLLM names) meet. Used through
:func:`sre_agent.ingest.otlp.decode_metrics`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa

from sre_agent.ingest.normalise import Normaliser
from sre_agent.store.schema import METRIC_MODEL_KEYS, METRIC_RESOURCE_SOURCES, canonical_metric_name

__all__ = ["flatten_metrics"]

_TEMPORALITY = (None, "delta", "cumulative")
MAX_ERRORS = 5
_INT64_LIMIT = 1 << 63  # fixed64/uint64 fields beyond int64 cannot be stored


def _first(keys: list[str], values: list[str], wanted: tuple[str, ...]) -> str | None:
    lookup = dict(zip(keys, values, strict=True))
    for key in wanted:
        if key in lookup:
            return lookup[key]
    return None


def _signature(keys: list[str], values: list[str]) -> bytes:
    """Order-independent encoding of attributes for the series key."""
    return "\x1e".join(f"{k}\x1f{v}" for k, v in sorted(zip(keys, values, strict=True))).encode("utf-8", "replace")


class _Rows:
    def __init__(self, names: list[str]) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in names}
        self.res_keys: list[str] = []
        self.res_values: list[str] = []
        self.res_offsets: list[int] = [0]
        self.keys: list[str] = []
        self.values: list[str] = []
        self.offsets: list[int] = [0]

    def add(self, row: dict[str, Any], point_keys: list[str], point_values: list[str], res: tuple[Any, ...]) -> None:
        for name, column in self.columns.items():
            column.append(row.get(name))
        self.keys.extend(point_keys)
        self.values.extend(point_values)
        self.offsets.append(len(self.keys))
        self.res_keys.extend(res[0])
        self.res_values.extend(res[1])
        self.res_offsets.append(len(self.res_keys))


def flatten_metrics(request: Any, norm: Normaliser, schema: pa.Schema) -> tuple[pa.Table, int, list[str]]:
    """Return ``(table, rejected, errors)`` for one parsed metrics request."""
    rows = _Rows([f.name for f in schema if f.name not in ("attributes", "resource_attributes")])
    rejected = 0
    errors: list[str] = []
    for resource_metrics in request.resource_metrics:
        res_keys, res_values = norm.map_items(resource_metrics.resource.attributes)
        res_fields = {col: _first(res_keys, res_values, keys) for col, keys in METRIC_RESOURCE_SOURCES.items()}
        res_sig = _signature(res_keys, res_values)
        res = (res_keys, res_values)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                name = canonical_metric_name(metric.name)
                base = {"name": name, "source_name": metric.name, "kind": kind, "unit": metric.unit or None}
                data = getattr(metric, kind)
                temporality = None
                if kind in ("sum", "histogram", "exponential_histogram"):
                    code = data.aggregation_temporality
                    temporality = _TEMPORALITY[code] if 0 <= code < 3 else None
                for point in data.data_points:
                    keys, values = norm.map_items(point.attributes)
                    reason = (
                        None if 0 < point.time_unix_nano < _INT64_LIMIT else "time_unix_nano missing or beyond 2262"
                    )
                    row = dict(base)
                    if reason is None:
                        reason = _fill_point(row, kind, point, metric, temporality)
                    if reason is not None:
                        rejected += 1
                        if len(errors) < MAX_ERRORS:
                            errors.append(f"metric {metric.name!r}: {reason}")
                        continue
                    key = hashlib.blake2b(name.encode("utf-8", "replace"), digest_size=16)
                    key.update(b"\x1d" + res_sig + b"\x1d" + _signature(keys, values))
                    row["series_key"] = key.hexdigest()
                    row["model"] = _first(keys, values, METRIC_MODEL_KEYS) or _first(
                        res_keys, res_values, METRIC_MODEL_KEYS
                    )
                    row.update(res_fields)
                    rows.add(row, keys, values, res)
    return _table(rows, schema), rejected, errors


def _fill_point(row: dict[str, Any], kind: str, point: Any, metric: Any, temporality: str | None) -> str | None:
    """Fill the value columns of one point; returns a rejection reason or None."""
    row["time_ns"] = point.time_unix_nano
    row["start_time_ns"] = point.start_time_unix_nano if 0 < point.start_time_unix_nano < _INT64_LIMIT else None
    row["temporality"] = temporality
    if kind in ("gauge", "sum"):
        which = point.WhichOneof("value")
        row["value"] = float(getattr(point, which)) if which else None
        row["is_monotonic"] = bool(metric.sum.is_monotonic) if kind == "sum" else None
        return None
    row["count"] = point.count
    if point.count >= _INT64_LIMIT:
        return "count beyond int64"
    row["sum"] = point.sum if kind == "summary" or point.HasField("sum") else None
    if kind == "histogram":
        bounds = list(point.explicit_bounds)
        counts = list(point.bucket_counts)
        if counts and len(counts) != len(bounds) + 1:
            return f"{len(counts)} bucket counts for {len(bounds)} bounds (want bounds + 1)"
        if counts and max(counts) >= _INT64_LIMIT:
            return "bucket count beyond int64"
        row["bounds"] = bounds
        row["bucket_counts"] = counts
    elif kind == "exponential_histogram":
        row["bounds"], row["bucket_counts"] = _exponential_buckets(point)
    return None


def _exponential_buckets(point: Any) -> tuple[list[float], list[int]]:
    """Explicit bounds for an exponential histogram's positive buckets.

    Bucket ``k`` covers ``(base**k, base**(k+1)]`` with ``base = 2**(2**-scale)``.
    Negative and zero observations are folded into the first bucket.
    """
    positive = point.positive
    counts = list(positive.bucket_counts)
    offset = positive.offset
    try:
        base = 2.0 ** (2.0**-point.scale)
        bounds = [base ** (offset + i) for i in range(len(counts) + 1)]
    except OverflowError:  # a scale or offset no real histogram uses
        return [], []
    low = point.zero_count + sum(point.negative.bucket_counts)
    if max([low, *counts]) >= _INT64_LIMIT:
        return [], []
    return bounds, [low, *counts, 0]


def _table(rows: _Rows, schema: pa.Schema) -> pa.Table:
    arrays: list[pa.Array] = []
    for fld in schema:
        if fld.name == "resource_attributes":
            arrays.append(_map(rows.res_offsets, rows.res_keys, rows.res_values))
        elif fld.name == "attributes":
            arrays.append(_map(rows.offsets, rows.keys, rows.values))
        else:
            arrays.append(pa.array(rows.columns[fld.name], type=fld.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _map(offsets: list[int], keys: list[str], values: list[str]) -> pa.Array:
    return pa.MapArray.from_arrays(
        pa.array(offsets, type=pa.int32()), pa.array(keys, type=pa.string()), pa.array(values, type=pa.string())
    )
