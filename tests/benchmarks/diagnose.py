"""Benchmark: a full diagnosis (all rules) over 10 million engine request spans.

Builds (once, cached in the temp directory) a DuckDB store with N engine
request spans, half before and half after a deploy, with realistic attributes
(16 replicas on 8 hosts, 3 models, 20 tenants, 2 routes in the attribute maps;
lognormal prompt and output lengths; cached tokens; queue, prefill, decode,
TTFT, TPOT, e2e) plus a metric stream (running/waiting/KV gauges and
prefix-cache counters per replica every 10 s), and a real regression: decode
on one host runs 2x slower after the deploy. Then times, in the same run and on
the same open read-only connection, a full ``diagnose`` (every installed rule)
and a bare DuckDB exact p99 of e2e grouped by window.

The spans are written in the stored layout ingest gives them (``span_rows``
with the promoted attributes in their columns; schema.py, "Stored layout").

    python tests/benchmarks/diagnose.py [--spans 10000000] [--db PATH] [--repeat 2] [--phases] [--engine chdb]

``--engine chdb [--accelerated]`` reads the same spans and metric points from ClickHouse in-process (chdb),
in the OTel Collector ClickHouse exporter's tables and row layout (``otel_traces`` with every
attribute a string in ``SpanAttributes``/``ResourceAttributes``, ``otel_metrics_gauge``/``_sum``;
tests/exporter_layout.py), through :mod:`sre_agent.store.clickhouse`; the bare p99 is then
ClickHouse's own exact p99 of the span ``Duration`` per window over that table. ``--accelerated``
also keeps the canonical columns as materialized columns
(:func:`sre_agent.store.clickhouse_schema.acceleration_ddl`), in a layout of its own.

``--phases`` also prints, after the timed runs, the process CPU of each step
of one diagnosis run serially (no background read), so the parts can be attributed.

Last line: ``diagnose: spans=N seconds=S bare_p99_seconds=B ratio=S/B`` (with ``engine=E`` first when
``--engine`` is given).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: exporter_layout

from sre_agent.analysis.selection import Selection
from sre_agent.store import schema

T0_NS = 1_790_000_000 * 1_000_000_000
HOUR_NS = 3600 * 1_000_000_000


def _bits(*keys: str) -> int:
    """``span_rows.promoted`` / ``promoted_resource`` for attributes stored once, in their columns (schema.py)."""
    index = {key: i for i, (key, _) in enumerate(schema.PROMOTED_KEYS)}
    return sum(1 << index[k] for k in keys)


# The stored form ingest gives these spans: the resource's service.*, host.name and the span's
# model, tenant and max_tokens live in their columns; the view spells them back into the maps.
PROMOTED_RESOURCE = _bits("host.name", "service.instance.id", "service.version", "service.name")
PROMOTED = _bits("gen_ai.request.model", "tenant.id", "gen_ai.request.max_tokens")


def build(path: Path, n: int) -> None:
    """Write the benchmark store (see module docstring)."""
    tmp = path.with_suffix(".building")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    con.execute(schema.SPANS_DDL)
    con.execute(schema.METRIC_POINTS_DDL)
    con.execute(schema.DEPLOYS_DDL)
    con.execute(
        f"""
        INSERT INTO span_rows
        WITH base AS (
          SELECT i, (i >= {n} // 2) AS cand, {T0_NS} + CAST(i * (2.0 * {HOUR_NS} / {n}) AS BIGINT) AS start_ns,
            hash(i) AS h, random() AS r1, random() AS r2, random() AS r3, random() AS r4
          FROM range({n}) t(i)
        ), a AS (
          SELECT *, 'gpu-' || (h % 8) AS host, 'vllm-' || (h % 16) AS pod, 't-' || ((h >> 8) % 20) AS tenant,
            ['llama-70b', 'llama-8b', 'qwen-32b'][CAST(1 + (h >> 16) % 3 AS BIGINT)] AS model,
            ['/v1/chat/completions', '/v1/completions'][CAST(1 + (h >> 20) % 2 AS BIGINT)] AS route,
            CAST(exp(6.0 + 1.0 * sqrt(-2 * ln(r1 + 1e-12)) * cos(6.283 * r2)) AS BIGINT) + 1 AS inp,
            CAST(exp(5.0 + 0.8 * sqrt(-2 * ln(r2 + 1e-12)) * cos(6.283 * r3)) AS BIGINT) + 2 AS outp
          FROM base
        ), l AS (
          SELECT *, CAST(inp * (0.5 * r3) AS BIGINT) AS cached,
            -ln(r4 + 1e-9) * 0.05 AS queue,
            (inp - CAST(inp * (0.5 * r3) AS BIGINT)) * 0.00008 * (0.8 + 0.4 * r1) AS prefill,
            (outp - 1) * 0.02 * (0.9 + 0.2 * r2) * CASE WHEN cand AND host = 'gpu-3' THEN 2.0 ELSE 1.0 END AS decode
          FROM a
        )
        SELECT printf('%032x', i), printf('%016x', i), NULL, 'llm_request', 'server', start_ns,
          start_ns + CAST((queue + prefill + decode) * 1e9 AS BIGINT), queue + prefill + decode,
          'unset', NULL, 'vllm', CASE WHEN cand THEN 'v2' ELSE 'v1' END, pod, host, tenant, 'vllm.llm_engine', true,
          model, 'req-' || i, inp, outp, cached, queue, queue + prefill, prefill, decode, prefill + decode,
          queue + prefill + decode, decode / (outp - 1), CASE WHEN r1 < 0.05 THEN 'length' ELSE 'stop' END, 0, NULL,
          1024, NULL, NULL, NULL, MAP {{}}, map(['http.route'], [route]), {PROMOTED}, {PROMOTED_RESOURCE}
        FROM l
        """
    )
    # Metric stream: per replica every 10 s, gauges plus cumulative prefix-cache counters.
    con.execute(
        f"""
        INSERT INTO metric_points
        WITH ticks AS (
          SELECT r AS replica, k, {T0_NS} + k * 10 * 1000000000 AS time_ns, (k >= 360) AS cand
          FROM range(16) a(r), range(720) b(k)
        ), m AS (
          SELECT t.*, x.name, x.kind,
            CASE x.name
              WHEN 'vllm:num_requests_running' THEN 40 + 10 * random()
              WHEN 'vllm:num_requests_waiting' THEN 2 * random()
              WHEN 'vllm:kv_cache_usage_perc' THEN 0.5 + 0.2 * random()
              WHEN 'vllm:prefix_cache_queries' THEN k * 30000.0
              ELSE k * 15000.0 END AS value
          FROM ticks t, (VALUES ('vllm:num_requests_running', 'gauge'), ('vllm:num_requests_waiting', 'gauge'),
                                ('vllm:kv_cache_usage_perc', 'gauge'), ('vllm:prefix_cache_queries', 'sum'),
                                ('vllm:prefix_cache_hits', 'sum')) x(name, kind)
        )
        SELECT name, name, kind, NULL, time_ns, {T0_NS}, value, kind = 'sum',
          CASE WHEN kind = 'sum' THEN 'cumulative' END, NULL, NULL, NULL, NULL, 'vllm',
          CASE WHEN cand THEN 'v2' ELSE 'v1' END, 'vllm-' || replica, 'gpu-' || (replica % 8), 'llama-70b',
          name || '|vllm-' || replica, map(['host.name'], ['gpu-' || (replica % 8)]), map(['model_name'], ['llama-70b'])
        FROM m
        """
    )
    con.execute(f"INSERT INTO deploys VALUES ({T0_NS + HOUR_NS}, 'vllm', 'v2', 'v1', 'benchmark', NULL)")
    con.execute("CHECKPOINT")
    con.close()
    tmp.rename(path)


def bare_p99_clickhouse(house: Any, value: str = "Duration / 1e9") -> float:
    """Seconds for ClickHouse's exact p99 of ``value`` per window over the exporter's table, bare.

    The default reads the span's ``Duration`` column; ``--engine chdb`` also times the p99 of
    the e2e attribute itself (``SpanAttributes['gen_ai.latency.e2e']``), which is where the
    exporter keeps it and what the diagnosis must read.
    """
    started = time.perf_counter()
    house.native(
        f"SELECT toUnixTimestamp64Nano(Timestamp) >= {T0_NS + HOUR_NS} AS w, "
        f"quantileExactInclusive(0.99)({value}) FROM otel_traces WHERE SpanKind = 'Server' GROUP BY w"
    )
    return time.perf_counter() - started


def bare_p99(con: duckdb.DuckDBPyConnection) -> float:
    """Seconds for an exact p99 of e2e per window, straight in DuckDB."""
    started = time.perf_counter()
    con.sql(
        f"SELECT start_ns >= {T0_NS + HOUR_NS} AS window, quantile_cont(e2e_s, 0.99) FROM spans "
        "WHERE is_engine GROUP BY ALL"
    ).fetchall()
    return time.perf_counter() - started


def phases(con: duckdb.DuckDBPyConnection, selection: Selection) -> None:
    """Print process CPU (user and system, s) of each step of one serial diagnosis."""
    import resource

    from sre_agent.analysis import diagnosis
    from sre_agent.analysis.compare import Comparison
    from sre_agent.analysis.rules_registry import load_rules

    def cpu() -> tuple[float, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime, usage.ru_stime

    spent: dict[str, tuple[float, float]] = {}
    last = cpu()

    def step(name: str) -> None:
        nonlocal last
        now = cpu()
        spent[name] = (now[0] - last[0], now[1] - last[1])
        last = now

    comparison = Comparison.open(con, selection)
    step("open (first scan)")
    _ = comparison.requests
    step("sample")
    estimates = diagnosis.estimate_metrics(comparison)
    regression = diagnosis.headline(comparison, estimates)
    step("estimates and headline")
    _ = comparison.busy_intervals
    step("busy-interval read")
    loaded, _failures = load_rules(None)
    diagnosis.run_rules(loaded, diagnosis._context(comparison, regression, estimates))
    step("rules")
    print(
        "process CPU per step, one serial run (user + system = total; system is mostly page faults):", file=sys.stderr
    )
    for name, (user, system) in spent.items():
        print(f"  {name:26s} {user:5.2f} + {system:4.2f} = {user + system:5.2f} s", file=sys.stderr)


def describe(report: Any) -> None:
    """The top finding and the slowest rules of a benchmark run, on stderr."""
    assert report is not None
    top = report.findings[0]
    print(f"top finding: {top.cause} scope={dict(top.scope)} score={top.score:.2f}", file=sys.stderr)
    slowest = sorted(((v, k) for k, v in report.timings.items() if k.startswith("rule.")), reverse=True)[:4]
    print("slowest rules: " + ", ".join(f"{k[5:]} {v:.2f}s" for v, k in slowest), file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--db", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=2, help="timed runs of each; the best is reported")
    parser.add_argument("--phases", action="store_true", help="also print the CPU of each step (see above)")
    parser.add_argument("--engine", choices=("duckdb", "chdb"), default=None, help="where the spans are read")
    parser.add_argument(
        "--accelerated",
        action="store_true",
        help="with --engine chdb: the canonical columns also kept as materialized columns (acceleration_ddl)",
    )
    args = parser.parse_args()
    path = args.db or Path(tempfile.gettempdir()) / f"sre-agent-diagnose-bench-{args.spans}-v3.duckdb"
    if not path.exists():
        started = time.perf_counter()
        build(path, args.spans)
        print(f"built {path} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.engine == "chdb":
        return run_chdb(path, args)
    from sre_agent import diagnose

    selection = Selection(mode="since_last_deploy")
    # Both timings run on one open read-only connection, as in a running server; the first
    # diagnosis warms the OS file cache and the imports.
    con = duckdb.connect(str(path), read_only=True)
    diagnose(con, selection)
    seconds, bare = [], []
    report = None
    for _ in range(args.repeat):
        started = time.perf_counter()
        report = diagnose(con, selection)
        seconds.append(time.perf_counter() - started)
        bare.append(bare_p99(con))
    if args.phases:
        phases(con, selection)
    con.close()
    describe(report)
    s, b = min(seconds), min(bare)
    engine = "engine=duckdb " if args.engine else ""
    print(f"diagnose: {engine}spans={args.spans} seconds={s:.2f} bare_p99_seconds={b:.2f} ratio={s / b:.1f}")
    return 0


def run_chdb(duck: Path, args: argparse.Namespace) -> int:
    """The benchmark on chdb over the exporter's tables (see the module docstring)."""
    from sre_agent import diagnose
    from sre_agent.store.clickhouse import connect_clickhouse

    target = duck.with_name(duck.stem + ("-accelerated" if args.accelerated else "") + ".chdb")
    if not target.exists():
        from exporter_layout import duckdb_to_exporter

        started = time.perf_counter()
        duckdb_to_exporter(duck, target)
        if args.accelerated:
            from chdb import session

            from sre_agent.store.clickhouse_schema import acceleration_ddl

            db = session.Session(str(target))
            for statement in acceleration_ddl():
                db.query(statement + " SETTINGS mutations_sync = 1" if "MATERIALIZE COLUMN" in statement else statement)
            db.close()
        print(f"laid out {target} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    selection = Selection(mode="since_last_deploy")
    house = connect_clickhouse(f"chdb:{target}")
    diagnose(house, selection)
    seconds, bare, bare_attribute = [], [], []
    report = None
    for _ in range(args.repeat):
        started = time.perf_counter()
        report = diagnose(house, selection)
        seconds.append(time.perf_counter() - started)
        bare.append(bare_p99_clickhouse(house))  # the same session, without the translation layer
        bare_attribute.append(bare_p99_clickhouse(house, "toFloat64OrNull(SpanAttributes['gen_ai.latency.e2e'])"))
    house.close()
    describe(report)
    s, b, a = min(seconds), min(bare), min(bare_attribute)
    print(f"bare p99 of the e2e attribute (a map lookup per row): {a:.2f} s, ratio {s / a:.1f}", file=sys.stderr)
    engine = "chdb-accelerated" if args.accelerated else "chdb"
    print(f"diagnose: engine={engine} spans={args.spans} seconds={s:.2f} bare_p99_seconds={b:.2f} ratio={s / b:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
