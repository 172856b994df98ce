"""Where telemetry rests and how it is read: the embedded DuckDB store and ClickHouse.

Owns the stored layout (``schema``, ``span_rows``, ``attribute_sql``), the embedded store
and its migrations (``embedded``, ``migrate``), SQL text helpers (``sql_text``), and the
scale-out engine over the OTel Collector's ClickHouse tables (``clickhouse``,
``clickhouse_dialect``, ``clickhouse_result``, ``clickhouse_schema``; the optional extra),
opened by ``sources``. May import ``errors``/``config`` and ``ingest.normalise``'s attribute
table; never ``analysis``, ``canary`` or ``api``.
"""
