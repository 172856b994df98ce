"""Store append benchmark: canonical span batches into a table that already holds ~1M rows.

Prefills ``--prefill`` spans (cheap rows generated in SQL, in time order), then
appends ``--batches`` batches of ``--batch`` vLLM-shaped spans decoded by
:func:`sre_agent.otlp.decode_traces` (20 span attributes, 5 resource
attributes) through :meth:`Store.append_spans`, and finally re-appends the
last batch to time the all-duplicates path. Wall time (DuckDB uses every
core). The last line is::

    store_append: spans_per_s=N duplicate_batch_spans_per_s=D existing_rows=R batch=B

Run: ``python tests/benchmarks/store_append.py [--prefill 1000000] [--batch 50000] [--batches 3]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from sre_agent.normalise import Normaliser
from sre_agent.otlp import decode_traces
from sre_agent.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import T0, build_bodies

SECOND = 1_000_000_000


def prefill(store: Store, rows: int) -> None:
    """``rows`` small spans one second apart before T0, written by DuckDB itself."""
    store.connection.execute(
        """INSERT INTO spans (trace_id, span_id, name, kind, start_ns, end_ns, duration_s, status_code,
               service_name, service_version, is_engine, e2e_s, resource_attributes, attributes)
           SELECT md5(i::VARCHAR), substr(md5((i * 7)::VARCHAR), 1, 16), 'llm_request', 'server',
               ? + i * ?, ? + i * ? + ?, 1.0, 'unset', 'vllm-server', '0.11.0', true, 1.0,
               MAP {'service.name': 'vllm-server'}, MAP {'gen_ai.latency.e2e': '1.0'}
           FROM range(?) t(i)""",
        [T0 - rows * SECOND, SECOND, T0 - rows * SECOND, SECOND, SECOND, rows],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefill", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    normaliser = Normaliser(hash_key=b"benchmark")
    bodies = build_bodies(args.batch * args.batches, 1000)
    tables = [decode_traces(b, "application/x-protobuf", normaliser=normaliser).table for b in bodies]
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
