"""Engine simulator, workload replay and scenario files; installed as ``sre_agent.replays``.

Modules, from the bottom up:

- ``costmodel``: roofline step-time model and hardware/model profiles.
- ``kvcache``: paged KV block pool with a reference-counted prefix cache.
- ``stats``: per-replica counters and histograms with vLLM's names and buckets.
- ``engine``: one vLLM replica (V1 iteration-level scheduler).
- ``workload``: trace loaders (Azure CSV, Mooncake JSONL, synthetic), tenants, prefix synthesis.
- ``gateway``: routing, dependency calls, retries, and the discrete-event loop.
- ``telemetry``: OTel SDK spans and metrics with simulated timestamps.
- ``outputs``: OTLP endpoint, collector-style JSON lines, store, memory.
- ``scenario``: the scenario file format (``scenarios/*.toml``) and its validation.
- ``replay``: run a scenario and measure its before/after regression.
"""
