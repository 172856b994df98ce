"""A synthetic incident store for the console's tests and benchmark.

One hour of traffic through a gateway into four vLLM replicas; at half time
``v2`` is deployed and the prefix cache on ``gpu-3`` stops hitting, so the
prompts there are prefilled from scratch: TTFT and e2e p99 regress, and the
``host_name=gpu-3`` slice holds most of the regression. Every request has
three spans (gateway root, a retrieval dependency, the engine span), so
``n_requests`` requests make ``3 * n_requests`` spans.

Built entirely in DuckDB SQL with hash-based pseudo-random numbers, so the
same arguments always give the same store (snapshot tests rely on it) and
ten million spans take seconds, not minutes.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from sre_agent.store.schema import DEPLOYS_DDL, METRIC_POINTS_DDL, SPANS_DDL

T0_NS = 1_780_000_000 * 1_000_000_000  # 2026-05-28T20:26:40Z
HOUR_NS = 3600 * 1_000_000_000
DEPLOY_NS = T0_NS + HOUR_NS // 2


def build_store(
    path: Path,
    n_requests: int = 20_000,
    *,
    incident: bool = True,
    broken_hosts: tuple[str, ...] = ("gpu-3",),
    tenants: tuple[str, ...] = ("acme", "globex", "initech"),
) -> Path:
    """Write the incident (or, with ``incident=False``, a quiet hour) into a new DuckDB file.

    ``broken_hosts`` lose their prefix cache at the deploy (all four: a
    regression located nowhere in particular); ``tenants`` split the traffic
    evenly by a hash of the request, independent of everything else.
    """
    hosts = ", ".join(f"'{h}'" for h in broken_hosts)
    tenant_list = "[" + ", ".join(f"'{t}'" for t in tenants) + "]"
    con = duckdb.connect(str(path))
    try:
        for ddl in (SPANS_DDL, METRIC_POINTS_DDL, DEPLOYS_DDL):
            con.execute(ddl)
        broken = f"host IN ({hosts}) AND t >= $deploy" if incident else "false"
        con.execute(
            f"""
            CREATE TEMP TABLE req AS
            WITH base AS (
                SELECT i,
                       $t0 + i * ($hour // $n) AS t,
                       'gpu-' || (i % 4 + 1) AS host,
                       CASE WHEN i % 3 = 0 THEN 'llama-3-70b' ELSE 'llama-3-8b' END AS model,
                       {tenant_list}[(hash(i, 7) % {len(tenants)})::BIGINT + 1] AS tenant,
                       CASE WHEN hash(i, 8) % 4 = 0 THEN '/v1/completions' ELSE '/v1/chat/completions' END AS route,
                       (hash(i, 1) % 1000000) / 1e6 AS u1, (hash(i, 2) % 1000000) / 1e6 AS u2,
                       (hash(i, 3) % 1000000) / 1e6 AS u3, (hash(i, 4) % 1000000) / 1e6 AS u4,
                       (hash(i, 5) % 1000000) / 1e6 AS u5, (hash(i, 6) % 10000) AS u6
                FROM range($n) r(i)
            ), shaped AS (
                SELECT *, CASE WHEN t >= $deploy THEN 'v2' ELSE 'v1' END AS version,
                       200 + (u1 * 1800)::BIGINT AS input_tokens, 20 + (u2 * 200)::BIGINT AS output_tokens,
                       pow(u3, 6) * 0.4 AS queue_s, 0.02 + u5 * 0.03 AS retrieval_s,
                       0.02 + u4 * 0.012 AS tpot_s, u6 < 50 AS failed
                FROM base
            )
            SELECT *, CASE WHEN {broken} THEN 0 ELSE (input_tokens * 0.6)::BIGINT END AS cached_tokens,
                   (input_tokens - CASE WHEN {broken} THEN 0 ELSE (input_tokens * 0.6)::BIGINT END)
                     * CASE WHEN {broken} THEN 0.004 ELSE 0.0009 END * (1 + u3) AS prefill_s
            FROM shaped
            """,
            {"t0": T0_NS, "hour": HOUR_NS, "n": n_requests, "deploy": DEPLOY_NS},
        )
        common = """
            md5(i::VARCHAR) AS trace_id, {span_id} AS span_id, {parent} AS parent_span_id, {name} AS name,
            {kind} AS kind, {start} AS start_ns, {start} + ({dur} * 1e9)::BIGINT AS end_ns, {dur} AS duration_s,
            CASE WHEN failed THEN 'error' ELSE 'ok' END AS status_code, NULL AS status_message,
            {service} AS service_name, {version} AS service_version, {instance} AS service_instance,
            host AS host_name, tenant AS tenant_id, NULL AS scope_name"""
        engine_start = "t + 5000000 + (retrieval_s * 1e9)::BIGINT"
        e2e = "(queue_s + prefill_s + tpot_s * (output_tokens - 1))"
        con.execute(
            f"""
            INSERT INTO span_rows BY NAME
            SELECT {
                common.format(
                    span_id="printf('%016x', 3 * i + 1)",
                    parent="NULL",
                    name="'POST ' || route",
                    kind="'server'",
                    start="t",
                    dur=f"({e2e} + retrieval_s + 0.01)",
                    service="'gateway'",
                    version="'g1'",
                    instance="'gateway-0'",
                )
            },
                   false AS is_engine, model, NULL AS request_id, input_tokens, output_tokens, NULL AS cached_tokens,
                   NULL AS queue_s, NULL AS ttft_s, NULL AS prefill_s, NULL AS decode_s, NULL AS inference_s,
                   NULL AS e2e_s, NULL AS tpot_s, NULL AS finish_reason, 0 AS attempt,
                   CASE WHEN failed THEN 'upstream_error' END AS error_type,
                   map(['service.name'], ['gateway']) AS extra_resource_attributes,
                   map(['http.route', 'tenant.id'], [route, tenant]) AS extra_attributes
            FROM req
            UNION ALL
            SELECT {
                common.format(
                    span_id="printf('%016x', 3 * i + 2)",
                    parent="printf('%016x', 3 * i + 1)",
                    name="'retrieval'",
                    kind="'client'",
                    start="t + 5000000",
                    dur="retrieval_s",
                    service="'gateway'",
                    version="'g1'",
                    instance="'gateway-0'",
                )
            },
                   false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                   map(['service.name'], ['gateway']), map(['peer.service'], ['vector-db'])
            FROM req
            UNION ALL
            SELECT {
                common.format(
                    span_id="printf('%016x', 3 * i + 3)",
                    parent="printf('%016x', 3 * i + 1)",
                    name="'llm_request'",
                    kind="'server'",
                    start=engine_start,
                    dur=e2e,
                    service="'vllm'",
                    version="version",
                    instance="host || '-pod'",
                )
            },
                   true, model, printf('req-%d', i), input_tokens, output_tokens, cached_tokens,
                   queue_s, queue_s + prefill_s, prefill_s, tpot_s * (output_tokens - 1),
                   prefill_s + tpot_s * (output_tokens - 1), {e2e}, tpot_s,
                   CASE WHEN failed THEN 'abort' ELSE 'stop' END, 0,
                   CASE WHEN failed THEN 'EngineDeadError' END,
                   map(['service.name', 'host.name'], ['vllm', host]),
                   map(['http.route', 'gen_ai.request.model'], [route, model])
            FROM req
            """
        )
        con.execute("INSERT INTO deploys VALUES (?, 'vllm', 'v2', 'v1', 'marker', 'synthetic incident')", [DEPLOY_NS])
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return path
