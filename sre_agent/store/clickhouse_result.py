"""A ClickHouse query's rows, fetched the ways the analysis fetches a DuckDB result (clickhouse_engine)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["ClickHouseResult"]


class ClickHouseResult:
    """A query's rows, fetched the ways the analysis fetches a DuckDB result."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table
        self._next = 0

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every remaining row as a tuple."""
        rows = list(self._rows(self._next))
        self._next = self._table.num_rows
        return rows

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row, or None when none is left."""
        if self._next >= self._table.num_rows:
            return None
        row = next(self._rows(self._next, 1))
        self._next += 1
        return row

    def _rows(self, start: int, length: int | None = None) -> Iterator[tuple[Any, ...]]:
        part = self._table.slice(start, length)
        columns = [column.to_pylist() for column in part.columns]
        return zip(*columns, strict=True) if columns else iter(())

    def fetchnumpy(self) -> dict[str, np.ndarray[Any, Any]]:
        """Columns as NumPy arrays; a column with NULLs is a masked array, as DuckDB gives it."""
        out: dict[str, np.ndarray[Any, Any]] = {}
        for name, column in zip(self._table.column_names, self._table.columns, strict=True):
            chunk = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            if chunk.null_count:
                mask = chunk.is_null().to_numpy(zero_copy_only=False)
                filled = chunk.fill_null(_fill_for(chunk.type)).to_numpy(zero_copy_only=False)
                out[name] = np.ma.MaskedArray(filled, mask=mask)
            else:
                out[name] = chunk.to_numpy(zero_copy_only=False)
        return out

    def to_arrow_table(self) -> pa.Table:
        """The rows as an Arrow table."""
        return self._table

    def to_arrow_reader(self, batch_size: int = 1_000_000) -> pa.RecordBatchReader:
        """The rows as a stream of Arrow record batches."""
        return pa.RecordBatchReader.from_batches(self._table.schema, self._table.to_batches(batch_size))

    def pl(self) -> Any:
        """The rows as a polars DataFrame."""
        import polars as pl

        return pl.from_arrow(self._table)


def _fill_for(kind: pa.DataType) -> Any:
    if pa.types.is_floating(kind):
        return float("nan")
    if pa.types.is_integer(kind):
        return 0
    if pa.types.is_boolean(kind):
        return False
    return None
