"""Store append benchmark: canonical span batches into a table that already holds ~1M rows.

Prefills ``--prefill`` spans (cheap rows generated in SQL, in time order), then
appends ``--batches`` batches of ``--batch`` vLLM-shaped spans decoded by
:func:`sre_agent.ingest.otlp.decode_traces` (20 span attributes, 5 resource
attributes) through :meth:`Store.append_spans`, and finally re-appends the
last batch to time the all-duplicates path. Wall time (DuckDB uses every
core). The last line is::

    store_append: spans_per_s=N duplicate_batch_spans_per_s=D existing_rows=R batch=B

``--floors`` first prints process CPU per span (microseconds) for commits of
``--floor-batch`` spans, each variant into its own fresh store, interleaved:
the Arrow scan (DuckDB validates every MAP row), the Parquet staging path the
store uses, the same rows without the two MAP columns, the MAP columns
alone read from Arrow and from Parquet without storing them, and two
candidate layouts for the attributes (key/value LIST columns; JSON text).
These are the storage floors behind the end-to-end ingest figure.

``--checkpoint`` first appends ``--checkpoint-spans`` spans in commits of
``--floor-batch`` (the size a loaded receiver commits) into two fresh stores,
one with DuckDB's default checkpoint threshold (16 MB of log) and one with the
store's (:data:`sre_agent.store.embedded.CHECKPOINT_THRESHOLD`), alternating commits,
and prints each one's wall time per span by quarter of the run, its commits'
p99 and longest (a commit that triggers a checkpoint waits for it) and the
final checkpoint: the automatic checkpoints' share of a busy writer's time.

``--duplicate-check`` prints the time of the store's duplicate check (the
stored rows a batch repeats, by an inner join that hashes the batch) against
the ANTI JOIN it replaced (which hashed the stored time range), for a batch of
``--floor-batch`` fresh spans whose time range covers 8k and 2M stored rows.
``--replay`` appends ``--replay-spans`` spans in a child process that exits
without closing the store (nothing checkpointed, as after a crash), then times
the next open, which replays the log.

Run: ``python tests/benchmarks/store_append.py [--prefill 1000000] [--batch 50000] [--batches 3] [--floors]
[--checkpoint] [--duplicate-check] [--replay]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_traces
from sre_agent.store.embedded import CHECKPOINT_THRESHOLD, Store

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import T0, build_bodies

SECOND = 1_000_000_000


def prefill(store: Store, rows: int) -> None:
    """``rows`` small spans one second apart before T0, written by DuckDB itself."""
    store.connection.execute(
        """INSERT INTO span_rows (trace_id, span_id, name, kind, start_ns, end_ns, duration_s, status_code,
               service_name, service_version, is_engine, e2e_s, extra_resource_attributes, extra_attributes)
           SELECT md5(i::VARCHAR), substr(md5((i * 7)::VARCHAR), 1, 16), 'llm_request', 'server',
               ? + i * ?, ? + i * ? + ?, 1.0, 'unset', 'vllm-server', '0.11.0', true, 1.0,
               MAP {'service.name': 'vllm-server'}, MAP {'gen_ai.latency.e2e': '1.0'}
           FROM range(?) t(i)""",
        [T0 - rows * SECOND, SECOND, T0 - rows * SECOND, SECOND, SECOND, rows],
    )


# The whole maps appended as the stored parts (promoted = 0): the layout before issue 18.
_STORED_NAMES = {"attributes": "extra_attributes", "resource_attributes": "extra_resource_attributes"}


def _append_arrow(store: Store, batch: pa.Table) -> None:
    con = store.connection
    con.register("_floor", batch.rename_columns(_STORED_NAMES.get(n, n) for n in batch.column_names))
    con.execute("INSERT INTO span_rows BY NAME SELECT * FROM _floor")
    con.unregister("_floor")


def _append_without_maps(store: Store, batch: pa.Table) -> None:
    con = store.connection
    con.register("_floor", batch.drop_columns(["attributes", "resource_attributes"]))
    con.execute("INSERT INTO span_rows BY NAME SELECT * FROM _floor")
    con.unregister("_floor")


def _scan_maps_arrow(store: Store, batch: pa.Table) -> None:
    con = store.connection
    con.register("_floor", batch.select(["attributes", "resource_attributes"]))
    con.execute("SELECT sum(cardinality(attributes) + cardinality(resource_attributes)) FROM _floor").fetchall()
    con.unregister("_floor")


def _scan_maps_parquet(store: Store, batch: pa.Table) -> None:
    import pyarrow.parquet as pq

    with tempfile.NamedTemporaryFile(suffix=".parquet") as file:
        pq.write_table(batch.select(["attributes", "resource_attributes"]), file.name, compression="none")
        query = "SELECT sum(cardinality(attributes) + cardinality(resource_attributes)) FROM read_parquet(?)"
        store.connection.execute(query, [file.name]).fetchall()


_MAPS = ("attributes", "resource_attributes")


def _as_lists(batch: pa.Table) -> pa.Table:
    """The two MAP columns as four LIST(VARCHAR) columns (keys, values): a candidate storage layout."""
    for name in _MAPS:
        column = batch.column(name).combine_chunks()
        assert isinstance(column, pa.MapArray)
        index = batch.schema.get_field_index(name)
        batch = batch.remove_column(index)
        for suffix, part in (("keys", column.keys), ("values", column.items)):
            lists = pa.ListArray.from_arrays(column.offsets, part, mask=column.is_null())
            batch = batch.append_column(f"{name}_{suffix}", lists)
    return batch


def _as_json(batch: pa.Table) -> pa.Table:
    """The two MAP columns as JSON object text (a candidate storage layout; built outside the timing)."""
    import json

    for name in _MAPS:
        index = batch.schema.get_field_index(name)
        text = [None if m is None else json.dumps(dict(m)) for m in batch.column(name).to_pylist()]
        batch = batch.set_column(index, name, pa.array(text, pa.string()))
    return batch


def _append_layout(store: Store, batch: pa.Table) -> None:
    """Append ``batch`` as it is into a table of its own shape (created on first use)."""
    con = store.connection
    con.register("_floor", batch)
    con.execute("CREATE TABLE IF NOT EXISTS layout AS SELECT * FROM _floor LIMIT 0")
    con.execute("INSERT INTO layout SELECT * FROM _floor")
    con.unregister("_floor")


def floors(tables: list[pa.Table], batch: int) -> None:
    """Print process CPU per span of each way to append (or just read) the same commits."""
    rows = pa.concat_tables(tables)
    commits = [rows.slice(i, batch) for i in range(0, rows.num_rows - batch + 1, batch)]
    # name -> (append, layout conversion); conversions run before the clock starts, so only
    # DuckDB's cost is timed.
    same: Callable[[pa.Table], pa.Table] = lambda table: table  # noqa: E731
    variants: dict[str, tuple[Callable[[Store, pa.Table], Any], Callable[[pa.Table], pa.Table]]] = {
        "append via Arrow scan (MAP rows validated)": (_append_arrow, same),
        "append via Parquet staging (Store.append_spans)": (Store.append_spans, same),
        "append without the two MAP columns": (_append_without_maps, same),
        "MAP columns read from Arrow, not stored": (_scan_maps_arrow, same),
        "MAP columns read from Parquet, not stored": (_scan_maps_parquet, same),
        "append with attributes as key/value lists": (_append_layout, _as_lists),
        "append with attributes as JSON text": (_append_layout, _as_json),
    }
    inputs = {name: [shape(c) for c in commits] for name, (_, shape) in variants.items()}
    cpu = dict.fromkeys(variants, 0.0)
    with tempfile.TemporaryDirectory() as folder:
        stores = {name: Store.open(os.path.join(folder, f"floor{i}.duckdb")) for i, name in enumerate(variants)}
        for i in range(len(commits)):
            for name in list(variants) if i % 2 == 0 else list(variants)[::-1]:
                started = time.process_time()
                variants[name][0](stores[name], inputs[name][i])
                cpu[name] += time.process_time() - started
        for store in stores.values():
            store.close()
    spans = batch * len(commits)
    print(f"storage floors, {len(commits)} commits of {batch} spans, process CPU:")
    for name, seconds in cpu.items():
        print(f"  {name:50s} {seconds / spans * 1e6:6.1f} us/span")


def checkpoints(tables: list[pa.Table], batch: int, spans: int) -> None:
    """Print wall us/span of appending with DuckDB's default checkpoint threshold and the store's."""
    rows = pa.concat_tables(tables)
    commits = []
    for shift in range(max(1, -(-spans // rows.num_rows))):
        # Shifted copies: fresh ids and later times, as a long run's traffic would be.
        copy = rows if shift == 0 else _shifted(rows, shift)
        commits.extend(copy.slice(i, batch) for i in range(0, copy.num_rows - batch + 1, batch))
    commits = commits[: max(4, spans // batch)]
    thresholds = {"DuckDB default (16MB)": "16MB", f"store ({CHECKPOINT_THRESHOLD})": CHECKPOINT_THRESHOLD}
    quarters: dict[str, list[float]] = {name: [0.0] * 4 for name in thresholds}
    commit_s: dict[str, list[float]] = {name: [] for name in thresholds}
    final: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        stores = {name: Store.open(os.path.join(folder, f"ckpt{i}.duckdb")) for i, name in enumerate(thresholds)}
        for name, threshold in thresholds.items():
            stores[name].connection.execute(f"SET checkpoint_threshold = '{threshold}'")
        for i, commit in enumerate(commits):
            for name in list(thresholds) if i % 2 == 0 else list(thresholds)[::-1]:
                started = time.perf_counter()
                stores[name].append_spans(commit)
                commit_s[name].append(time.perf_counter() - started)
                quarters[name][min(3, 4 * i // len(commits))] += commit_s[name][-1]
        for name, store in stores.items():
            started = time.perf_counter()
            store.connection.execute("CHECKPOINT")
            final[name] = time.perf_counter() - started
            store.close()
    per_quarter = len(commits) * batch / 4
    print(f"checkpoint threshold, {len(commits)} commits of {batch} spans, wall us/span by quarter:")
    for name in thresholds:
        figures = " ".join(f"{seconds / per_quarter * 1e6:6.2f}" for seconds in quarters[name])
        ordered = sorted(commit_s[name])
        p99, longest = ordered[int(0.99 * (len(ordered) - 1))], ordered[-1]
        print(
            f"  {name:24s} {figures}   commit p99 {p99 * 1e3:.0f} ms, longest {longest * 1e3:.0f} ms; "
            f"final checkpoint {final[name]:.2f} s"
        )


_PREVIOUS_CHECK = """SELECT b._position FROM _sre_ids b
    ANTI JOIN (SELECT trace_id, span_id FROM span_rows WHERE start_ns BETWEEN ? AND ?) s
        ON s.trace_id = b.trace_id AND s.span_id = b.span_id
    QUALIFY row_number() OVER (PARTITION BY b.trace_id, b.span_id ORDER BY b._position) = 1
    ORDER BY b._position"""
_STORE_CHECK = """SELECT b._position FROM span_rows s
    JOIN _sre_ids b ON s.trace_id = b.trace_id AND s.span_id = b.span_id
    WHERE s.start_ns BETWEEN ? AND ?"""


def duplicate_checks(batch: int, repeat: int = 10) -> None:
    """Print ms per check of the store's duplicate query and the one it replaced, narrow and wide ranges."""
    import numpy as np

    stored = 2_000_000
    with tempfile.TemporaryDirectory() as folder, Store.open(os.path.join(folder, "dup.duckdb")) as store:
        prefill(store, stored)
        con = store.connection
        rng = np.random.default_rng(7)
        print(f"duplicate check, a batch of {batch} fresh spans against {stored} stored, ms per check:")
        for covered in (8_000, stored):
            # Fresh ids, start times spread over the last `covered` stored rows (one a second before T0).
            offsets = rng.integers(1, covered + 1, batch)
            ids = pa.table(
                {
                    "trace_id": [f"{0xF0000000 + i:032x}" for i in range(batch)],
                    "span_id": [f"{i:016x}" for i in range(batch)],
                    "_position": pa.array(range(batch), pa.int64()),
                }
            )
            lo, hi = T0 - int(offsets.max()) * SECOND, T0 - int(offsets.min()) * SECOND
            con.register("_sre_ids", ids)
            timings = {}
            for name, query in (("previous (anti join)", _PREVIOUS_CHECK), ("store (inner join)", _STORE_CHECK)):
                started = time.perf_counter()
                for _ in range(repeat):
                    con.execute(query, [lo, hi]).fetchnumpy()
                timings[name] = (time.perf_counter() - started) / repeat * 1e3
            con.unregister("_sre_ids")
            figures = ", ".join(f"{name} {ms:.1f}" for name, ms in timings.items())
            print(f"  range covering {covered} stored rows: {figures}")


def replay(tables: list[pa.Table], spans: int) -> None:
    """Print the size of a killed writer's log and how long the next open takes to replay it."""
    import pickle
    import subprocess

    rows = pa.concat_tables(tables)
    copies = [rows] + [_shifted(rows, shift) for shift in range(1, max(1, -(-spans // rows.num_rows)))]
    data = pa.concat_tables(copies).slice(0, spans)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "killed.duckdb")
        batches = os.path.join(folder, "batches.pickle")
        with open(batches, "wb") as out:
            pickle.dump([data.slice(i, 4096) for i in range(0, data.num_rows, 4096)], out)
        child = (
            "import os, pickle, sys; from sre_agent.store.embedded import Store; s = Store.open(sys.argv[1]); "
            "[s.append_spans(b) for b in pickle.load(open(sys.argv[2], 'rb'))]; os._exit(0)"
        )
        subprocess.run([sys.executable, "-c", child, path, batches], check=True)
        log_mib = os.path.getsize(path + ".wal") / 2**20 if os.path.exists(path + ".wal") else 0.0
        started = time.perf_counter()
        with Store.open(path, read_only=True) as store:
            opened = time.perf_counter() - started
            count = store.counts()["spans"]
    print(f"replay: a killed writer's log of {log_mib:.0f} MiB ({count} spans) replayed on open in {opened:.2f} s")


def _shifted(rows: pa.Table, shift: int) -> pa.Table:
    """``rows`` with new trace ids and start times ``shift`` hours later."""
    import pyarrow.compute as pc

    trace = pc.binary_join_element_wise(pa.scalar(f"{shift:04x}"), pc.utf8_slice_codeunits(rows["trace_id"], 4), "")
    start = pc.add(rows["start_ns"], pa.scalar(shift * 3_600_000_000_000, pa.int64()))
    rows = rows.set_column(rows.schema.get_field_index("trace_id"), "trace_id", trace)
    return rows.set_column(rows.schema.get_field_index("start_ns"), "start_ns", start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefill", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--floors", action="store_true", help="first print the storage floors (see above)")
    parser.add_argument("--floor-batch", type=int, default=4096, help="spans per commit for --floors/--checkpoint")
    parser.add_argument("--checkpoint", action="store_true", help="first compare checkpoint thresholds (see above)")
    parser.add_argument("--checkpoint-spans", type=int, default=1_000_000, help="spans per store for --checkpoint")
    parser.add_argument("--duplicate-check", action="store_true", help="first time the duplicate check (see above)")
    parser.add_argument("--replay", action="store_true", help="first time a killed writer's log replay (see above)")
    parser.add_argument("--replay-spans", type=int, default=500_000, help="spans in the log for --replay")
    args = parser.parse_args()
    normaliser = Normaliser(hash_key=b"benchmark")
    bodies = build_bodies(args.batch * args.batches, 1000)
    tables = [decode_traces(b, "application/x-protobuf", normaliser=normaliser).table for b in bodies]
    if args.floors:
        floors(tables, args.floor_batch)
    if args.checkpoint:
        checkpoints(tables, args.floor_batch, args.checkpoint_spans)
    if args.duplicate_check:
        duplicate_checks(args.floor_batch)
    if args.replay:
        replay(tables, args.replay_spans)
    per_batch = len(tables) // args.batches
    batches = [pa.concat_tables(tables[i * per_batch : (i + 1) * per_batch]) for i in range(args.batches)]
    with tempfile.TemporaryDirectory() as folder, Store.open(os.path.join(folder, "bench.duckdb")) as store:
        started = time.perf_counter()
        prefill(store, args.prefill)
        print(f"prefill {args.prefill} rows: {time.perf_counter() - started:.1f}s")
        rates = []
        for batch in batches:
            started = time.perf_counter()
            inserted = store.append_spans(batch)
            elapsed = time.perf_counter() - started
            assert inserted == batch.num_rows, inserted
            rates.append(batch.num_rows / elapsed)
            print(f"append {batch.num_rows} spans: {elapsed:.2f}s ({rates[-1]:.0f} spans/s)")
        started = time.perf_counter()
        assert store.append_spans(batches[-1]) == 0
        duplicate_rate = batches[-1].num_rows / (time.perf_counter() - started)
        existing = store.counts()["spans"]
    print(f"load_avg={os.getloadavg()[0]:.1f}")
    print(
        f"store_append: spans_per_s={sorted(rates)[len(rates) // 2]:.0f} "
        f"duplicate_batch_spans_per_s={duplicate_rate:.0f} existing_rows={existing} batch={args.batch}"
    )


if __name__ == "__main__":
    main()
