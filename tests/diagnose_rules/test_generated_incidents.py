"""Miss classes of issue 12 on incidents from the seeded generator (``replays/incidents.py``).

Each case is one generated incident (seed drawn from the development range 0-999, bundled
trace sample, 600 requests a side; the code-completion cases use the real traces in
../shared/data/traces, 1,200 a side), replayed into a real store and diagnosed in-process.
The assertions are about mechanisms, not about the seed: which cause may lead and which
may not appear given what the simulator changed. A replay plus diagnosis takes 5-20 s on
the shared 2-core machine, so the cases run with ``-m slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sre_agent import diagnose
from sre_agent.analysis.report import Report
from sre_agent.replays.incidents import generate, replay_into_store

pytestmark = pytest.mark.slow


SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"


def _diagnosed(
    seed: int, tmp_path: Path, *, traces: Path | None = None, per_side: int = 600
) -> tuple[object, list[tuple[str, str | None, str]]]:
    incident = generate(seed, traces, max_per_side=per_side) if traces else generate(seed, max_per_side=per_side)
    info, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    # The drawn cause moved the simulator's own numbers (at 600 requests a side often not beyond
    # sampling noise, which the benchmark's "visible" asks; the mechanisms here are still there).
    assert info["shows"], info["effect"]
    report = diagnose(tmp_path / "store.duckdb", selection)
    return incident, [(f.cause, f.stage, f.title) for f in report.findings]


def _shared_report(seed: int, cause: str, tmp_path: Path) -> Report:
    """The report on incident ``seed`` drawn from the real traces (1,200 requests a side), its cause checked."""
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident = generate(seed, SHARED_TRACES, max_per_side=1200)
    assert incident.truth.cause == cause, incident.truth
    info, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    assert info["shows"], info["effect"]
    return diagnose(tmp_path / "store.duckdb", selection)


def test_new_tenant_with_longer_prompts_is_traffic_mix(tmp_path: Path) -> None:
    # Miss class 3: a tenant that did not exist before the deploy sends 28 % of the traffic with
    # prompts several times longer. Its requests have no baseline twin in any (tenant, length)
    # cell; they must still count in the counterfactual, or the mix explains nothing.
    incident, findings = _diagnosed(40, tmp_path)
    assert incident.truth.cause == "traffic_mix"  # type: ignore[attr-defined]
    assert "new tenant" in incident.truth.detail  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == "traffic_mix", findings


def test_stage_share_is_not_a_decode_slowdown(tmp_path: Path) -> None:
    # Miss class 8: a tenant with longer prompts grows; decode time per token at equal running
    # batch did not rise, so no finding may name decode_slowdown because the decode stage holds
    # the tail excess ("60 % of the trace p90 tail excess is decode time").
    incident, findings = _diagnosed(3, tmp_path)
    assert incident.truth.cause == "traffic_mix"  # type: ignore[attr-defined]
    assert findings[0][0] == "traffic_mix", findings
    assert all(cause != "decode_slowdown" for cause, _, _ in findings), findings
    # A stage-fallback finding names its mechanism before the stage share.
    for cause, stage, title in findings:
        if title[0].isdigit() and "tail excess is" in title:
            pytest.fail(f"{cause} [{stage}] titled only by its stage share: {title}")


@pytest.mark.parametrize(
    ("seed", "cause"),
    [
        (37, "capacity"),  # max_num_seqs cut during a rolling restart with cold caches
        # Arrivals doubled at the deploy. (Seed 109, 26 % more arrivals, was here until its only
        # significant headline proved to be an ITL histogram whose tokens counted as independent:
        # its e2e and TTFT p99 moved 1.07x and 1.09x on 500 and 624 requests, within noise. 108 is
        # the first dev-range load incident with engine spans, >= 400 requests a side and an e2e
        # or TTFT p99 up >= 1.3x in the simulator's own numbers.)
        (108, "load"),
    ],
)
def test_small_sample_queueing_is_still_explained(seed: int, cause: str, tmp_path: Path) -> None:
    # Miss class 1 (and 7's rule side): about 600 requests a side put 6 requests in each p99
    # tail, too few to split into stages, and the queueing rule fell silent ("no rule explains
    # the regression"). It now splits the widest tail that holds enough requests and says which.
    incident, findings = _diagnosed(seed, tmp_path)
    assert incident.truth.cause == cause  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == cause, findings
    assert all(c != "decode_slowdown" for c, _, _ in findings[:3]), findings


def test_canary_split_is_not_capacity_when_each_replica_carries_the_same_load(tmp_path: Path) -> None:
    # A version pair on a canary split: 2 of 6 replicas run the new version (prefill x2.2) and
    # get their share of the traffic. The candidate side has fewer replicas *and* fewer
    # arrivals, so the load per replica is unchanged; crediting the replica count alone
    # called it capacity. Queueing follows arrivals per replica (Little's law per replica).
    incident, findings = _diagnosed(98, tmp_path)
    assert incident.deploy_style == "canary_split"  # type: ignore[attr-defined]
    assert incident.truth.cause == "prefill_slowdown"  # type: ignore[attr-defined]
    assert findings[0][0] == "prefill_slowdown", findings
    assert all(cause not in ("capacity", "load") for cause, _, _ in findings), findings


@pytest.mark.parametrize("seed", [120, 150])
def test_dependency_of_one_tenant_is_scoped_to_the_tenant(seed: int, tmp_path: Path) -> None:
    # Miss class 6: retrieval slowed for one tenant only. Only that tenant's requests call
    # retrieval (a RAG route), so the spans of the group show no variation to split and the
    # tenant's route and max_tokens select the very same requests. The finding must lead
    # (its headline is dependency time itself, so the group explains all of it, not the
    # dependencies' share of the trace tail) and name the owner of the traffic, tenant.id.
    incident, findings = _diagnosed(seed, tmp_path)
    truth = incident.truth  # type: ignore[attr-defined]
    assert truth.cause == "dependency", truth
    assert list(truth.scope) == ["tenant.id"], truth
    assert findings, "no finding at all"
    assert findings[0][0] == "dependency", findings
    assert f"tenant.id={truth.scope['tenant.id']}" in findings[0][2], findings[0]


@pytest.mark.parametrize("seed", [18, 58, 163])
def test_retries_after_a_gateway_timeout_lead_over_the_timeouts_they_cause(seed: int, tmp_path: Path) -> None:
    # Miss class 5: a new gateway retries attempts whose first token is late. The root spans
    # carry the gateway's own timeouts (504) while the engine reports no error: the timeouts
    # are the retry policy's symptom, so retry_amplification must rank above errors.
    incident, findings = _diagnosed(seed, tmp_path)
    assert incident.truth.cause == "retry_amplification"  # type: ignore[attr-defined]
    assert "retries attempts after" in incident.truth.detail  # type: ignore[attr-defined]
    causes = [cause for cause, _, _ in findings]
    assert causes, "no finding at all"
    assert causes[0] == "retry_amplification", findings


@pytest.mark.parametrize("seed", [95, 151])
def test_engine_errors_behind_a_retrying_gateway_stay_errors(seed: int, tmp_path: Path) -> None:
    # The other side of class 5: the engine itself answers 503 and its own error share rises, so
    # the failures are the errors rule's even if the gateway retries some of them.
    incident, findings = _diagnosed(seed, tmp_path)
    assert incident.truth.cause == "errors"  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == "errors", findings


@pytest.mark.parametrize("seed", [121, 135])
def test_replicas_removed_without_engine_spans_is_capacity(seed: int, tmp_path: Path) -> None:
    # Miss class 1: replicas removed at the deploy, same arrivals, telemetry without engine
    # request spans (gateway spans + engine metrics; metrics only). The removed replicas keep
    # exporting frozen counters, and finish their in-flight requests just after the deploy, so
    # counting the instances that report (or that finished anything) saw no replica gone and
    # the ITL rise of the fuller survivors was called decode_slowdown.
    incident, findings = _diagnosed(seed, tmp_path)
    assert incident.truth.cause == "capacity"  # type: ignore[attr-defined]
    assert "replicas removed" in incident.truth.detail  # type: ignore[attr-defined]
    assert incident.shape in ("gateway-spans+metrics", "metrics-only")  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == "capacity", findings
    assert all(cause != "decode_slowdown" for cause, _, _ in findings), findings


def test_smaller_step_budget_without_step_histogram_is_batch_composition(tmp_path: Path) -> None:
    # Miss class 2: SGLang (no vllm:iteration_tokens) with the step budget cut 4096 -> 512.
    # Prefill per uncached token rose at equal batch, so it was called prefill_slowdown; but
    # only prompts longer than the budget are split into more steps. The shortest quarter of
    # prompts is computed as before, and that separates a budget from a slower prefill path.
    incident, findings = _diagnosed(25, tmp_path)
    assert incident.truth.cause == "batch_composition"  # type: ignore[attr-defined]
    assert "max_num_batched_tokens" in incident.truth.detail  # type: ignore[attr-defined]
    assert incident.shape == "sglang"  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == "batch_composition", findings


@pytest.mark.parametrize("seed", [6, 20])
def test_slower_prefill_path_is_not_read_as_a_step_budget(seed: int, tmp_path: Path) -> None:
    # The other side of class 2's test: a prefill kernel slowdown costs short prompts more too,
    # so it stays prefill_slowdown and no batch_composition finding comes from prompt lengths.
    incident, findings = _diagnosed(seed, tmp_path)
    assert incident.truth.cause == "prefill_slowdown"  # type: ignore[attr-defined]
    assert findings[0][0] == "prefill_slowdown", findings
    assert all("smaller step budget" not in title for _, _, title in findings), findings


def test_a_borderline_prefill_slowdown_after_a_rollout_leads_what_explains_its_rise(tmp_path: Path) -> None:
    # Seed 66, a row of the test above until the fifteenth session: prefill x1.22 in a rolling
    # restart of six replicas, 600 requests a side. With the rollout's 55 s in the candidate window
    # its cold caches lifted TTFT enough for a regression; compared from when the rollout finished
    # (resolve._rollout), TTFT p99 x1.45 is within its noise and the prefill slowdown, at 0.55 just
    # under the mechanism bar, leads the findings after "none". Still no step-budget reading.
    incident, findings = _diagnosed(66, tmp_path)
    assert incident.truth.cause == "prefill_slowdown"  # type: ignore[attr-defined]
    assert [cause for cause, _, _ in findings[:2]] == ["none", "prefill_slowdown"], findings
    assert all("smaller step budget" not in title for _, _, title in findings), findings


@pytest.mark.parametrize("seed", [749, 770])
def test_prefill_slowdown_on_code_completion_is_prefill_slowdown(seed: int, tmp_path: Path) -> None:
    # Miss class 4: a prefill kernel regression on Azure's code trace (long prompts, ~20-token
    # answers, arrivals in bursts of ~100). It was ranked below decode_slowdown and load:
    # a burst on one side of the deploy read as 77 % more load (the Poisson error ignores
    # bursts; the per-slice spread does not), the slower prefill grew the running batch until
    # no equal-batch bucket overlapped, and a TPOT headline credited prefill nothing although
    # decode at equal batch did not slow. Needs the real traces in ../shared/data/traces.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident, findings = _diagnosed(seed, tmp_path, traces=SHARED_TRACES, per_side=1200)
    assert incident.truth.cause == "prefill_slowdown"  # type: ignore[attr-defined]
    assert incident.trace == "azure-code"  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == "prefill_slowdown", findings


def _step_mix(seed: int, tmp_path: Path) -> tuple[object, object]:
    import duckdb

    from sre_agent.analysis.compare import Comparison
    from sre_agent.rules._steps import decode_step_mix

    incident = generate(seed, SHARED_TRACES, max_per_side=1200)
    _, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    con = duckdb.connect(str(tmp_path / "store.duckdb"), read_only=True)
    try:
        comparison = Comparison.open(con, selection)
        return incident, decode_step_mix(comparison, comparison.metrics)
    finally:
        con.close()


@pytest.mark.parametrize(
    ("seed", "cause"), [(685, "prefill_slowdown"), (23, "decode_slowdown"), (81, "traffic_mix"), (269, "traffic_mix")]
)
def test_decode_steps_split_into_decode_work_and_shared_prefill(seed: int, cause: str, tmp_path: Path) -> None:
    # Class 4, the mechanism: a request's TPOT is the mean time of the steps it decodes in, and
    # those steps carry its replica's prefill chunks. Fitting tpot = a + b*running + g*prefill per
    # step on each side splits the rise: a slower prefill raises g, a slower decode a and b, and
    # a new tenant's longer prompts raise the prefill arriving per replica, so the prefill per
    # step, at the old g (class 3; before, that part counted as decode or prefill slowing).
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident, mix = _step_mix(seed, tmp_path)
    assert incident.truth.cause == cause  # type: ignore[attr-defined]
    assert mix is not None
    share = mix.decode_share  # type: ignore[attr-defined]
    assert share is not None
    if cause == "prefill_slowdown":
        assert share < 0.5, mix  # most of the rise is the shared prefill
    elif cause == "traffic_mix":
        assert share < 0.2, mix
        assert (mix.work_share or 0.0) > 0.5, mix  # type: ignore[attr-defined]
    else:
        assert share > 0.8, mix


@pytest.mark.parametrize(
    ("seed", "cause"), [(685, "prefill_slowdown"), (23, "decode_slowdown"), (27, "decode_slowdown")]
)
def test_slower_decode_steps_are_named_by_what_slowed_them(seed: int, cause: str, tmp_path: Path) -> None:
    # Class 4 end to end: a prefill regression (x1.49, mooncake conversations) made TPOT rise more than prefill
    # per token at equal batch and was called decode_slowdown; decode regressions must stay so.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident, findings = _diagnosed(seed, tmp_path, traces=SHARED_TRACES, per_side=1200)
    assert incident.truth.cause == cause  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == cause, findings


def test_gateway_spans_without_engine_spans_give_the_headline_a_ci(tmp_path: Path) -> None:
    # Telemetry of a gateway's spans plus engine metrics (no engine request spans): the root
    # spans time every request, so the headline is their duration with a CI over time blocks
    # (metric histograms alone carry none), and the trace headline must not break the stage split.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident = generate(54, SHARED_TRACES, max_per_side=1200)
    info, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    assert info["shape"] == "gateway-spans+metrics"
    assert info["visible"]
    report = diagnose(tmp_path / "store.duckdb", selection)
    assert report.regression.metric == "trace"
    assert report.regression.ci is not None
    assert report.regression.ci[0] > 0
    assert not report.errors, report.errors
    assert incident.truth.cause == "kv_pressure"  # type: ignore[attr-defined]
    assert report.findings
    assert report.findings[0].cause == "kv_pressure"


@pytest.mark.parametrize("seed", [46, 166])
def test_lost_prefix_cache_outranks_the_prefill_it_slows(seed: int, tmp_path: Path) -> None:
    # Prefix caching turned off. Seed 46: a rolling restart inside the candidate window, so the
    # new replicas stop counting queries and hits/queries reads the old replicas' last seconds
    # (0.19 -> 0.18); hits per prompt token served is the rate. Seed 166: 11 % more uncached work
    # per request near saturation triples the queue; at the same load per replica that queue is
    # the lost cache's, not a prefill slowdown's (prefill per token rose only through busier steps).
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident, findings = _diagnosed(seed, tmp_path, traces=SHARED_TRACES, per_side=1200)
    assert incident.truth.cause == "prefix_cache"  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == "prefix_cache", findings


# Mechanisms that dev incidents (real traces, 1,200 requests a side) showed unexplained or
# misread, each case: (seed, expected top cause, telemetry shape, words its title must carry).
_MECHANISM_CASES = [
    # A slower decode (x1.39) at unchanged arrivals kept every request longer, so the running batch
    # grew 23 -> 43 (Little's law). Equal-batch buckets matched the baseline's bursts (steps heavy
    # with prefill) with the candidate's ordinary moments and read TPOT 13 % *lower*: no rule
    # explained an e2e p99 up 1.55x. At unchanged load and work only a slower engine grows the
    # batch, so the comparison falls back to equal prompt size.
    pytest.param(90, "decode_slowdown", "vllm-v0", "running batch grew at unchanged load", id="batch-grew"),
    # max_num_batched_tokens 4096 -> 1024 on Azure conversations, mostly shorter than 1024 tokens:
    # the largest steps' bucket moved but the steps' p99 did not, so the histogram test said
    # "unchanged" and nothing explained a TTFT p90 up 12 %. The long prompts' prefill cost showed
    # it ("smaller step budget"); since the largest steps two buckets smaller at the same work
    # count as a cut, the histogram does (ddb6683).
    pytest.param(271, "batch_composition", "vllm-v0", "largest steps 4096 -> 1024", id="budget-long-prompts"),
    # A healthy deploy on a saturated fleet (gateway spans + engine metrics): requests last
    # minutes and the engine's e2e histogram counts them when they finish, so the candidate's
    # finishers started under the baseline's backlog. Its p50 read 16 -> 49 s while the traces
    # (every request, by start, with a CI) did not move, and finished requests counted as arrivals
    # made it load, then kv_pressure.
    pytest.param(204, "none", "gateway-spans+metrics", "", id="finishers-not-arrivals"),
    # A guardrail 6x slower (26 -> 155 ms mean) without engine spans moved no trace quantile, and
    # nothing measured dependency time there. The traces' dependency time is now a stage headline,
    # and the dependency rule's SE no longer has a floor of one slice's worth (0.05 s at 20 slices
    # had scored this shift z = 1.8).
    pytest.param(85, "dependency", "gateway-spans+metrics", "guardrail", id="dependency-no-engine-spans"),
    # 2 of 4 replicas removed; they keep exporting num_requests_running = 0. The plain gauge mean
    # read the running batch per replica as flat (2.8 -> 3.1) where the two left ran 5.5 each, and
    # the TPOT headline's tail was split on decode seconds, which fell: no rule explained it.
    pytest.param(1030005, "capacity", "vllm-v1", "replicas 4 -> 2", id="removed-replicas-idle-gauge"),
    # A new tenant sends 25 % of the traffic with longer prompts (chunked prefill): the decode steps
    # carry 2.4x the prompt tokens, so TPOT rose at equal batch. The stage fallback handed that
    # part to prefill_slowdown, though prefill per uncached token did not rise at equal batch and
    # size (7 %, z 2.5): the steps carry more prefill, not costlier, and the prompts grew.
    pytest.param(81, "traffic_mix", "vllm-v1", "More work per request", id="new-tenant-prefill-in-decode-steps"),
    # max_num_batched_tokens 8192 -> 1024 on a canary split: the p99 step (662 -> 782 tokens) sat
    # below both budgets, only the largest steps fell; prefill_slowdown led.
    pytest.param(1040005, "batch_composition", "vllm-v1", "largest steps 4096 -> 1024", id="budget-largest-steps"),
    # A new tenant's longer answers fill the cache and preempt: KV per running request rose no
    # more than the tokens a running request holds (time-weighted), so the pool did not shrink;
    # kv_pressure led.
    pytest.param(1050285, "traffic_mix", "vllm-v1", "work per request", id="longer-answers-fill-the-cache"),
    # Prefill x1.58 on long prompts (spans only): prefill per token at equal batch and size read
    # flat (z 0.4) while the step fit's prefill cost per token rose 85 ms. With no more prompt
    # work to own it, the decode time lost to the costlier prefill stays prefill's (a first
    # version of the mix hand-off dropped it and the fallback named capacity).
    # (Since the thirteenth session the prefill rule reads the same step fit itself and leads.)
    pytest.param(1040246, "prefill_slowdown", "spans-only", "Prefill", id="prefill-by-step-fit"),
    # Decode x1.55 on vLLM V0 (rolling restart): prefill steps between decodes dilute TPOT, which at
    # equal batch rose 7 % (z 0.7), and nothing explained the ITL p50 x2.0 headline. The median
    # inter-token step doubled while the running batch grew 1.31x: a step grows at most in
    # proportion to its batch at the same cost.
    pytest.param(1050140, "decode_slowdown", "vllm-v0", "median decode step", id="v0-decode-by-the-median-step"),
    # Decode x3.75 at light load: slower steps gather more arrivals, so the mean tokens per step grew
    # x3.1 and the p99 crossed into the prefill-carrying steps (8 -> 464 tokens, cap 1024 -> 4096);
    # batch_composition led at 0.9. The median decode step rose x3.9 with the tokens per step: the
    # steps grew because they last longer.
    pytest.param(263, "decode_slowdown", "vllm-v1", "per output token", id="slower-steps-gather-more"),
    # Its control: chunked prefill turned off makes steps bigger (p99 3871 -> 13615 tokens) at the
    # same plain decode step, which stays batch_composition.
    pytest.param(106, "batch_composition", "vllm-v1", "Tokens per engine step rose", id="chunking-off-bigger-steps"),
    # Chunked prefill turned off with a budget above the prompts: the step shape did not move (cap
    # 16384 both sides), prefill per uncached token rose 30 % at equal batch (z 4.1) and
    # prefill_slowdown led, though the step fit's cost of a prompt token in a step fell 2 % (z -5):
    # the prompts waited for steps with room, the per-token compute was the same.
    pytest.param(1100005, "batch_composition", "vllm-v1", "costs no more in a step", id="chunking-off-prompts-wait"),
    # A decode x3.15 on a V0 canary serving 2 of 3 replicas (twice the arrivals on twice the
    # replicas): the raw arrival rate credited the slower decode steps' prefill pressure to load.
    pytest.param(1090215, "decode_slowdown", "vllm-v0", "output token", id="canary-more-replicas-not-load"),
    # Metrics only: decode x2.6 kept more requests running, which filled the KV cache and preempted
    # (0 -> 64) at a flat cache share per running request; the preemptions blocked the
    # engine-metrics decode reading and kv_pressure led.
    pytest.param(1090211, "decode_slowdown", "metrics-only", "inter-token latency", id="preemptions-echo-slower-steps"),
    # Prefix caching off on SGLang: each request holds its own copy of the prefix, so KV per running
    # request rose x1.29 (private tokens x1.25) and preemptions rose; read as a smaller pool, that
    # withheld the queue's share from prefix_cache (0 % explained) and prefill_slowdown led (prefill
    # per uncached token +45 % at equal batch: the steps carry everyone's new prefill).
    pytest.param(1090098, "prefix_cache", "sglang", "Prefix-cache hit rate fell", id="cache-off-private-kv"),
    # A new tenant (16 % of the traffic, longer prompts) on SGLang: its prompts had nothing cached,
    # so the hit rate fell 18 % -> 9 % with 96 % of the lost cached tokens in a tenant absent from
    # the baseline (prefix_cache@newco), and prefill per token rose 18 % at equal batch while the
    # step fit held a prompt token's cost in a step flat (bound +1 %); prefill_slowdown led.
    pytest.param(1100231, "traffic_mix", "sglang", "request mix changed", id="new-tenant-no-cache-no-slower-prefill"),
    # Arrivals x2.0 at the gateway during a rolling restart, engine metrics only: replicas averaged
    # 3.6 of 4 over the window, which excluded load, and a rate that rose excluded capacity: no
    # finding. Arrivals counted at the gateway are the offered load whatever the replicas did.
    pytest.param(1100164, "load", "gateway-spans+metrics", "Offered load rose", id="surge-during-rolling-restart"),
    # The same from the engines' metrics alone: finished requests x2.0 while a restart left 5.2 of 6
    # replicas and the waiting gauge rose. Fewer replicas cannot raise throughput: more arrivals.
    pytest.param(1090294, "load", "metrics-only", "Offered load rose", id="surge-during-restart-metrics-only"),
    # Arrivals x2.0 into a saturated engine, metrics only: finished requests rose 13 % while the
    # waiting gauge went 2 -> 246 on average; the rate read flat and the slower steps of the
    # bigger batch read as decode_slowdown. Arrivals = finished + growth of waiting and running.
    pytest.param(1110034, "load", "metrics-only", "Offered load rose", id="surge-into-a-backlog-metrics-only"),
    # Arrivals x2.0 on a bursty trace (per-slice z 1.3 < 3): load was no confirmed driver, and the
    # queue-dominated tail's stage finding said capacity by default (replicas unchanged).
    pytest.param(1090159, "load", "vllm-v1", "More arrivals per second", id="bursty-load-not-capacity"),
    # max_num_seqs 64 -> 4 at a hot swap, metrics only: the running gauge's peak rose 26 -> 44 (the
    # old cap's requests still ran at the first scrape) while 128 waited on average, so the peak
    # showed no lower cap and no rule explained TTFT p99 x64. Where requests wait, a replica runs
    # at its cap: 4 there against 12 when the baseline's requests waited.
    pytest.param(1140136, "capacity", "metrics-only", "requests wait while", id="cap-cut-at-a-hot-swap-metrics-only"),
    # The same cut to 18 with the gateway's spans: peak 47 -> 64, and running 40 per replica where
    # requests waited, against a baseline that never queued (its peak, 47, the reference).
    pytest.param(1140055, "capacity", "gateway-spans+metrics", "Capacity fell", id="cap-cut-at-a-hot-swap-gateway"),
    # Arrivals x2.0 with engine spans: the headline was the ITL histogram's p99 (x2.7; no per-request
    # twin: the TPOT p99 tail did not grow), so the span rules had no excess to decompose and the
    # metric rule stood aside because spans existed: no finding. A headline only the metric stream
    # measured is the metric rule's, with arrivals counted from the engine spans.
    pytest.param(1140095, "load", "vllm-v1", "Offered load rose", id="itl-histogram-headline-with-spans"),
    # ...but beside spans its aggregate reading does not outrank a span rule's: prefill slowed
    # (per uncached token at equal batch, from spans, 0.60) while the metric rule read the mean
    # ITL's rise as a decode slowdown (0.80) and led.
    pytest.param(1140148, "prefill_slowdown", "vllm-v1", "", id="metric-rule-below-span-rules"),
    # A lower saturation level with more work per running request is not a cap: caching off,
    # metrics only (hit rate 29 % -> 0); fewer requests ran where requests waited (28 -> 21.5)
    # because each held more prompt to prefill, and capacity led prefix_cache (0.62 over 0.57).
    pytest.param(1150026, "prefix_cache", "metrics-only", "Prefix-cache hit rate fell", id="lost-cache-not-a-cap"),
    # Beside engine spans the metric rule read a running peak 9 -> 8 with 0.19 -> 0.23 waiting as a
    # lower cap and led (0.07) a retrieval dependency 3.2x slower on the RAG route (0.06).
    pytest.param(
        1150149, "dependency", "vllm-v1", "Dependency span 'retrieval'", id="peak-without-backlog-beside-spans"
    ),
    # A smaller token budget (SGLang 4096 -> 512) admits slowly: the peak fell 49 -> 12 and all of
    # the TTFT tail excess was queue time, read as a lower running cap. Requests waited at running
    # counts spread below the peak (a third at one value, where a cap reads its cap), so no cap binds
    # and the queue is the budget's, beside its long-prompt prefill signature.
    pytest.param(1160081, "batch_composition", "sglang", "admits requests slower", id="budget-cut-not-a-cap"),
    # ...while a cap still binds when single requests wait below it: max_num_seqs 128 -> 11, one
    # request waiting at 4-10 running (it arrived since the last step), every queue of 4-7 at 11.
    pytest.param(1160283, "capacity", "gateway-spans+metrics", "Capacity fell", id="cap-binds-beside-single-waits"),
    # A canary on 1 of 3 replicas with a third of bursty traffic (3.9 -> 2.0 req/s, z = -2.5, within
    # the bursts) carries the same load per replica; the rate still nets against the replicas, so
    # "replicas 2 -> 1" is no capacity loss (chunked prefill turned off on the canary).
    pytest.param(1160000, "batch_composition", "sglang", "", id="canary-share-nets-bursty-rate"),
    # A replica answers 503 to 14 % and the gateway retries: clients see no slower p99 (x1.07, not
    # significant), so the report said "no regression" first although 5 % of requests now need a
    # second attempt (z = 7.3). The retried share is the headline then, as the failed share is.
    pytest.param(
        1150161, "retry_amplification", "gateway-spans+metrics", "Attempts per request rose", id="retries-as-headline"
    ),
    # Prefix caching off under vLLM V0, whose spans carry no cached-token count: the counters say
    # 30 % -> 0 %, but the queue's drivers read every prompt token as uncached on both sides, so the
    # prompts' prefill per token rose x1.21 and the queue (all of the TTFT excess) was a slowdown's.
    pytest.param(1150042, "prefix_cache", "vllm-v0", "Prefix-cache hit rate fell", id="lost-cache-without-span-counts"),
    # ...and a cache that stopped hitting gives each running request its own copy of the prefix:
    # KV per running request x1.58 with the prompts unchanged was read as a smaller pool, and
    # kv_pressure led. The tokens a request holds on its own rose as much (hit rate 34 % -> 4 %).
    pytest.param(
        1150164, "prefix_cache", "vllm-v0", "Prefix-cache hit rate fell", id="lost-sharing-not-a-smaller-pool"
    ),
    # A new tenant's longer answers (20 % of traffic): 7.3 % of requests beyond the old e2e p99
    # against 0.8 % (p = 1e-14), but the p99's own CI spanned -1.5..+11 s: "no regression".
    pytest.param(1150218, "traffic_mix", "spans-only", "", id="heavier-tail-beyond-a-wide-p99-ci"),
    # A token budget cut 8192 -> 512: the queue held 84 % of the TTFT excess and went to a x1.01
    # "prefill slowdown" although the step fit bounds a prompt token's cost in a step at +1.6 %.
    pytest.param(1160038, "batch_composition", "sglang", "more engine steps", id="budget-spread-is-no-slowdown"),
    # A replica answers 503 to 11 % and the gateway retries on a peer: 3.3 % of requests retried
    # (z = 5.8) make all of the gateway p99 tail, yet the retry finding's confidence read 0.33
    # ("ten per hundred is unmistakable") and the peer the retries landed on led as a slice.
    pytest.param(1150021, "retry_amplification", "vllm-v1", "Attempts per request rose", id="retries-fill-a-p99-tail"),
    # Decode x3 at unchanged load: requests stayed longer, the running batch grew 18 -> 87 past every
    # equal-batch bucket, and a 69 s TTFT backlog made the prompt counter per arriving request read
    # the same prompts as x0.81 of the work. The decode finding was damped as "other prefill work",
    # prefill's echo of the slower shared steps (+43 % per token at equal size) led, and the queue's
    # stage finding named a x1.02 prefill driver. The step fit puts the rise in the decode work.
    pytest.param(1210222, "decode_slowdown", "vllm-v1", "Time per output token", id="decode-led-past-every-batch"),
    # Prefill x2.43 on SGLang: long prompts +83 % per token, short ones -7 % (their time is mostly
    # the decode work of their steps), which read as a smaller step budget (0.70). The step fit's cost
    # of a prompt token in a step rose beyond its 95 % bound: the prefill path, not the budget.
    pytest.param(1210261, "prefill_slowdown", "sglang", "Prefill", id="costlier-prompt-token-not-a-budget"),
    # SGLang budget 16384 -> 256: no step histogram, the prefill per token did not rise (short chunks
    # cost less), and the queue-only tail went to capacity by default. The TPOT p99 fell 143 -> 20 ms
    # at a steady median: the decode stalls beside whole long prompts were gone, as a smaller
    # budget trades them for TTFT.
    pytest.param(1210256, "batch_composition", "sglang", "Decode stalls", id="budget-cut-ends-decode-stalls"),
    # Arrivals x2 on Azure's code trace (x1.85 measured, z 1.8 within its bursts), spans only: the
    # running batch went 17 -> 40 and the queue went to a x1.02 batch-composition term, while the
    # budget rule read prefill +21 % per token "at the same load". The load's point estimate is the
    # one driver that moves utilisation as much as the queue grew.
    pytest.param(1210097, "load", "spans-only", "More arrivals per second", id="bursty-surge-not-prompt-spread"),
    # A template that broke the prefix cache (hit rate 11 % -> 2 %) at a saturated baseline (TTFT p99
    # 8.8 s), gateway spans and engine metrics: 9 % more tokens computed explained 8 % of TTFT p99
    # x3.1 by their log rise, and kv_pressure (preemptions 0 -> 0.02 per request, the same KV per
    # running request) led. The engines' histograms put nearly all of the TTFT rise in queue time.
    # A healthy deploy whose baseline window ended at its last request 108 s before the deploy: the
    # ITL histogram, counting intervals when generated, held half the intervals of the baseline's
    # spans (the long answers still decoding after the window's end), and its p90 read x8.6 while
    # every span's TPOT p90 held: REGRESSED, no finding. It is a table row, not a headline, now.
    # A guardrail x3.3 for hooli, the tenant sending 80 % of the traffic: 99.7 % of the added time,
    # but not 20 points more than its traffic, so the finding named every request. initech's
    # guardrail moved +2.5 % against hooli's +227 %.
    pytest.param(1210092, "dependency", "vllm-v0", "for tenant.id=hooli", id="largest-tenant-alone-slowed"),
    # A new tenant's long prompts (31 % of traffic): uncached work x1.44 but shorter answers, so the
    # queue's work at the baseline's seconds per token fell and its stage finding said capacity by
    # default; prefill per token rose 29 % at equal batch (the steps carry 92 -> 146 prompt tokens)
    # while the step fit saw no sure rise of a prompt token's cost, and prefill_slowdown led.
    pytest.param(1160110, "traffic_mix", "vllm-v1", "More work per request", id="long-prompts-share-the-steps"),
    # Chunked prefill turned off on Azure's code trace under a 16384-token budget: the steps were as
    # big as before (cap and p99 unchanged), only no decode rode along with a prompt any more, and
    # the ITL p99 rose x2.4 at a steady median, same load, work and per-token costs: no rule
    # explained it. Decodes stalled behind whole prompts, the mirror of a smaller budget.
    # A known miss since 9210857 (strict: it fails the suite once it passes again). The ITL p99
    # had counted as risen because its interval took the 32,370 inter-token intervals for
    # independent draws: the baseline had none above its p99 bucket (0.5-0.75 s), and an empty
    # tail was read as "no clustering". Read at the bucket's lower edge, the stalls come in bursts
    # (the candidate's 2.3 % above 0.75 s sit in 7 of 54 scrapes, the baseline's 0 in 55: Fisher
    # p = 0.006, short of the family's bar), and no other latency rose beyond its noise.
    pytest.param(
        1200213,
        "batch_composition",
        "vllm-v1",
        "Decode stalls behind",
        id="chunking-off-stalls",
        marks=pytest.mark.xfail(
            strict=True,
            reason="the fleet's ITL tail rose in 7 of 54 scrapes: "
            "within the family-wise bar once its stalls are counted as bursts",
        ),
    ),
    # Prefill x2.78 into a saturated fleet (TTFT p99 5.7 -> 207 s): TPOT x4.8 and the batch 23 -> 63
    # past every equal-batch bucket, so the queue's decode driver was dropped and its stage finding
    # said capacity by default. The step fit: a prompt token at least 131 % costlier in every step,
    # and the costlier prefill all of the steps' rise; the decodes beside it are its echo.
    pytest.param(1200152, "prefill_slowdown", "vllm-v1", "Prefill", id="slower-prefill-past-every-batch"),
    # num_gpu_blocks cut to 4160: the smaller pool evicted the cached prefixes (hit rate 34 % -> 9 %)
    # and preempted requests; prefix_cache led at 0.85. Each running request held x6.4 the KV
    # share against x1.45 of its own tokens: the pool shrank, the lost prefixes are its doing.
    pytest.param(1150228, "kv_pressure", "vllm-v1", "KV pool", id="smaller-pool-evicts-prefixes"),
    # A new tenant (20 % of traffic) whose long prompts the gateway rejects with 400: the failed share
    # 0 % -> 1.4 % was the headline and errors led at 0.18, the mix named by nothing (the reweighting
    # reads latencies). The root spans confine the rise to newco, which the baseline never served.
    pytest.param(1150010, "traffic_mix", "vllm-v1", "tenant.id=newco", id="new-tenant-rejected"),
    # A decode x2.41 on a canary serving 2 of 3 replicas, metrics beside spans: the canary's 0.92 req/s
    # against the baseline's 0.52 read as load up 78 % although each replica carried 0.48 against
    # 0.52. Two versions side by side own their replicas: their offered load is per replica.
    pytest.param(1200131, "decode_slowdown", "vllm-v1", "inter-token latency", id="canary-rate-per-replica"),
    # ...and two tails that rose at a steady median are not that: a decode x1.91 on one replica of six
    # (+8.9 % per token over all at equal batch, z 10.8) and a prefix cache turned off (uncached
    # prompt tokens per request x1.55 make the steps that carry them longer). Both read as
    # "decode stalls behind prompts" before the stall signature asked for flat costs and work.
    # (Since the thirteenth session the slice rule reads that replica at a tail wide enough to split and leads.)
    pytest.param(1200272, "decode_slowdown", "spans-only", "replica-5", id="one-replica-slower-not-stalls"),
    pytest.param(1150206, "prefix_cache", "metrics-only", "Prefix-cache hit rate fell", id="lost-cache-not-stalls"),
    pytest.param(1210029, "none", "vllm-v1", "No significant", id="itl-histogram-of-other-tokens"),
    pytest.param(
        1210224, "prefix_cache", "gateway-spans+metrics", "Prefix-cache hit rate fell", id="lost-cache-full-fleet"
    ),
]


@pytest.mark.parametrize(("seed", "cause", "shape", "in_title"), _MECHANISM_CASES)
def test_mechanisms_the_generated_incidents_showed(
    seed: int, cause: str, shape: str, in_title: str, tmp_path: Path
) -> None:
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident, findings = _diagnosed(seed, tmp_path, traces=SHARED_TRACES, per_side=1200)
    assert incident.truth.cause == cause  # type: ignore[attr-defined]
    assert incident.shape == shape  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == cause, findings
    assert in_title in findings[0][2], findings[0]


@pytest.mark.parametrize("seed", [64, 142, 224, 421, 715, 1100070])
def test_a_regression_on_one_replica_is_scoped_to_that_replica(seed: int, tmp_path: Path) -> None:
    # Scope on replica-confined incidents. 64: the engine on replica-2 answers 503 before serving,
    # which leaves no engine span; the gateway's attempt spans still name the host they called.
    # 142: prefill slowed on replica-2, the one replica the deploy gave the new version, so the
    # new version and the replica hold the same candidate requests; the version has no baseline
    # and scored a little higher, and the scope named the version alone. 224: decode slowed on
    # replica-2 of 4, metrics only: its mean ITL rose x1.86 while its peers' rose x1.10-1.19.
    # 421, 715: decode slowed on replica-1 only, engine spans; the router moved load onto the peers,
    # whose tails grew too, so no slice held enough of the slow requests. Compared with itself at
    # equal batch (421) or, its batch grown like its peers', at equal prompt size (715), only
    # replica-1's TPOT rose. 1100070: decode x1.49 on replica-3 of 4; the running gauge's peak went
    # 10 -> 9 with nobody waiting (0.072 -> 0.075) and the tail's queue time falling, which the
    # queueing rule read as a lower max_num_seqs (capacity at 0.9, scoped to replica-3).
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident = generate(seed, SHARED_TRACES, max_per_side=1200)
    truth = incident.truth
    assert list(truth.scope) == ["host.name"], truth
    info, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    assert info["visible"], info["effect"]
    report = diagnose(tmp_path / "store.duckdb", selection)
    assert report.findings, "no finding at all"
    top = report.findings[0]
    assert top.cause == truth.cause, report.findings
    assert top.scope.get("host.name") == truth.scope["host.name"], top.scope


def test_truncations_in_a_new_tenants_traffic_are_the_mix(tmp_path: Path) -> None:
    # Miss class 3 through the errors rule: a new tenant asks for longer answers, so more of its
    # requests stop at their max_tokens (finish_reason=length). The rise lives in traffic the
    # baseline never served: what those requests ask, not a stack that truncates. It was scoped
    # to the finish-reason attribute itself (a slice that only restates the category) and, on
    # SGLang incidents of the unseen range, led the report at full confidence.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident = generate(577, SHARED_TRACES, max_per_side=1200)
    assert incident.truth.cause == "traffic_mix", incident.truth  # type: ignore[attr-defined]
    assert "new tenant" in incident.truth.detail  # type: ignore[attr-defined]
    info, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    assert info["visible"], info["effect"]
    report = diagnose(tmp_path / "store.duckdb", selection)
    assert report.findings[0].cause == "traffic_mix", report.findings
    errors = [f for f in report.findings if f.cause == "errors"]
    assert errors, "the finish-reason rise is real and should still be reported"
    assert errors[0].scope == {"tenant.id": "newco"}, errors[0].scope
    assert any(e.signal == "rise_in_new_traffic" for e in errors[0].evidence), errors[0].evidence
    assert errors[0].confidence < report.findings[0].confidence


@pytest.mark.parametrize("seed", [325, 681])
def test_a_decode_slowdown_everywhere_on_two_replicas_has_no_replica_scope(seed: int, tmp_path: Path) -> None:
    # The control for 224's scope: decode slowed on every replica, metrics only, two replicas
    # routed unevenly before the deploy, so their ITL ratios differ by x1.2-1.5; with no third
    # replica there is no peer group to say which one departed, and none may be named.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident = generate(seed, SHARED_TRACES, max_per_side=1200)
    truth = incident.truth  # type: ignore[attr-defined]
    assert truth.cause == "decode_slowdown", truth
    assert not truth.scope, truth
    assert incident.shape == "metrics-only"  # type: ignore[attr-defined]
    _, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    report = diagnose(tmp_path / "store.duckdb", selection)
    assert report.findings[0].cause == "decode_slowdown", report.findings
    assert report.findings[0].scope == {}, report.findings[0].scope


def test_a_prefill_slowdown_everywhere_is_not_one_replicas(tmp_path: Path) -> None:
    # The control for 715: prefill slowed on every replica (x2.18); replica-1's running batch grew
    # x4.9 against x2.9 and x4.8 on its peers, so at equal prompt size it looked costlier than
    # them, as any replica given more load would. No replica may be named.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident = generate(107, SHARED_TRACES, max_per_side=1200)
    truth = incident.truth  # type: ignore[attr-defined]
    assert truth.cause == "prefill_slowdown", truth
    assert not truth.scope, truth
    _, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    report = diagnose(tmp_path / "store.duckdb", selection)
    assert report.findings[0].cause == "prefill_slowdown", report.findings
    assert "host.name" not in report.findings[0].scope, report.findings[0].scope


def test_a_running_peak_one_lower_is_no_cap(tmp_path: Path) -> None:
    # A new tenant's longer prompts (a third of the traffic): the running gauge's peak went 7 -> 6 at
    # 2.7 running on average with the waiting gauge 0.02 -> 0.08, and the queueing rule read a lower
    # max_num_seqs (capacity at 0.9). One request is the gauge's own step: a peak moves by it by chance.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident, findings = _diagnosed(1210077, tmp_path, traces=SHARED_TRACES, per_side=1200)
    assert incident.truth.cause == "traffic_mix"  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert not any("max running requests" in title for _, _, title in findings), findings


def test_an_error_on_every_route_is_not_scoped_to_the_busiest(tmp_path: Path) -> None:
    # The engine answers 503 to 6 % of every request; the route carrying 81 % of the traffic held
    # 87 % of the rise and the other route's error share rose less by chance (a fifth of the
    # traffic, a dozen errors). "The rest moved at most a third as much" confines durations, not
    # a rare outcome's share: no slice.
    report = _shared_report(1150259, "errors", tmp_path)
    assert report.findings[0].cause == "errors", report.findings
    assert not report.findings[0].scope, report.findings[0]


def test_a_lost_prefix_cache_is_a_regression_without_spans(tmp_path: Path) -> None:
    # Metrics only: a prompt template puts a per-request value first and the hit rate falls 24 % -> 0.
    # TTFT p99 0.25 -> 0.48 s over 1,100 requests a side, but vLLM's buckets (0.1, 0.25, 0.5 s) and
    # the scrapes' replica differences made the two order-statistic intervals overlap: "no
    # regression". 0.8 % against 11 % of requests above 0.25 s, over 59 scrapes a side, is one.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident = generate(1230193, SHARED_TRACES, max_per_side=1200)
    assert incident.truth.cause == "prefix_cache"
    assert incident.shape == "metrics-only"
    _, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    report = diagnose(tmp_path / "store.duckdb", selection)
    assert report.regression.significant, report.regression
    assert report.regression.metric == "ttft", report.regression
    assert report.findings[0].cause == "prefix_cache", report.findings


@pytest.mark.parametrize(
    ("seed", "detail"),
    [
        # A tenant with a third longer prompts grows from 10 % to 44 % of the traffic (SGLang):
        # TPOT +37 %, no per-token cost up at equal batch, 91 % of the step fit's rise is more
        # prefill per step at the old cost.
        (1230267, "grows"),
        # A new tenant's 5,100-token prompts with 14-token answers, a fifth of the traffic
        # (spans only): half the fitted rise is more prefill per step.
        (1230112, "new tenant"),
    ],
)
def test_more_prefill_per_step_at_unchanged_load_is_the_mix(seed: int, detail: str, tmp_path: Path) -> None:
    # The queue grew, no replica got more requests, and the decode's per-token rise vanished at
    # equal batch: the decode term was dropped and the queue went to `capacity` by default. The
    # step fit says who brought the work: the part of the rise from more prefill per step at the
    # old cost belongs to the longer prompts.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident, findings = _diagnosed(seed, tmp_path, traces=SHARED_TRACES, per_side=1200)
    assert incident.truth.cause == "traffic_mix"  # type: ignore[attr-defined]
    assert detail in incident.truth.detail  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == "traffic_mix", findings
    assert all(cause != "capacity" for cause, _, _ in findings), findings


def test_prefill_riding_slower_decode_steps_is_not_batch_composition(tmp_path: Path) -> None:
    # Decode x2.59 into a saturating fleet: prefill per uncached token rose 112 % at equal batch
    # while a prompt token's cost in a step did not, and batch_composition read "prompts spread
    # over more steps" at 0.7. The step fit put 99 % of the TPOT rise in the decode work of a step:
    # the steps themselves got slower, and prompts riding them with it.
    report = _shared_report(1220058, "decode_slowdown", tmp_path)
    causes = [f.cause for f in report.findings]
    assert causes, "no finding at all"
    assert causes[0] == "decode_slowdown", report.findings
    assert "batch_composition" not in causes, report.findings


def test_a_prompt_token_costlier_in_every_step_is_a_prefill_slowdown(tmp_path: Path) -> None:
    # A canary (prefill x1.49) on two of three replicas beside a saturated baseline: the
    # equal-batch buckets held 21 % of the canary's requests and read +21 % at z = 1.1, and "no rule
    # explains the regression". The step fit reads a prompt token's cost in a step from every
    # decoding request: +50 %, at least +43 %, with all of the TPOT rise in costlier prefill.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident, findings = _diagnosed(1230016, tmp_path, traces=SHARED_TRACES, per_side=1200)
    assert incident.truth.cause == "prefill_slowdown"  # type: ignore[attr-defined]
    assert incident.deploy_style == "canary_split"  # type: ignore[attr-defined]
    assert findings, "no finding at all"
    assert findings[0][0] == "prefill_slowdown", findings


def test_one_replicas_costlier_prefill_is_read_by_its_own_step_fit(tmp_path: Path) -> None:
    # Prefill x1.55 on replica-2 alone, which also runs a version of its own. Filtering the slice by
    # that version left it no baseline, and its p99 tail held 4 requests: no slice finding, and the
    # stage fallback named `capacity`. Read by host, at a tail wide enough to split, the slice's raw
    # drivers name decode (TPOT x2.4 against prefill per token x1.4, the two share its steps); the
    # replica's own step fit puts 97 % of the rise in a prompt token's cost in a step.
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing (CI has ../shared beside the checkout)"
    incident = generate(1230269, SHARED_TRACES, max_per_side=1200)
    truth = incident.truth
    assert truth.cause == "prefill_slowdown"
    assert dict(truth.scope) == {"host.name": "replica-2"}, truth.scope
    _, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    report = diagnose(tmp_path / "store.duckdb", selection)
    assert report.findings, "no finding at all"
    assert report.findings[0].cause == "prefill_slowdown", report.findings
    assert report.findings[0].scope.get("host.name") == "replica-2", report.findings[0].scope


def test_a_decode_slowdown_at_equal_batch_corroborates_a_headline_short_of_the_family_bar(tmp_path: Path) -> None:
    # Decode x2.15 in a rolling restart: TPOT p50 x2.14 with its 95 % CI above zero, but z = 2.2
    # against the family-wise bar of 2.5 over four latencies, and the report said "no regression"
    # above a decode_slowdown at 0.66. TPOT at equal batch, a control of its own, confirms the rise.
    report = _shared_report(1230025, "decode_slowdown", tmp_path)
    assert report.regression.significant, report.regression
    assert "corroborates" in report.regression.note, report.regression.note
    assert report.findings[0].cause == "decode_slowdown", report.findings


def test_one_replica_taking_a_surge_is_load_not_its_decode(tmp_path: Path) -> None:
    # Arrivals x2 with prefix-affinity routing: replica-2 took the surge (91 % of the extra slow
    # requests) and its TPOT rose with a batch of 36 -> 229, so the slice's largest raw driver was
    # decode. Its own step fit put 37 % of the TPOT rise in the decode work of a step: the batch
    # grew around the steps, and the slice's arrivals name it.
    report = _shared_report(1220117, "load", tmp_path)
    causes = [f.cause for f in report.findings]
    assert causes, "no finding at all"
    assert causes[0] == "load", report.findings
    assert "decode_slowdown" not in causes[:2], report.findings


def test_a_stage_quantile_moved_by_the_mix_is_no_regression(tmp_path: Path) -> None:
    # Nothing changed but the traffic: the RAG route (retrieval ~110 ms) grew from 9 % to 13 % of
    # requests beside chat completions (a 25 ms guardrail). No user-facing latency rose; the
    # dependency p90 crossed from one route's times into the other's (x1.79) and was reported as
    # a stage regression led by traffic_mix.
    report = _shared_report(1230259, "none", tmp_path)
    assert not report.regression.significant, report.regression
    assert report.findings[0].cause == "none", report.findings


@pytest.mark.parametrize(
    ("seed", "cause"),
    [
        # Arrivals x1.47 at the deploy (610 against 1,185 requests), gateway spans and engine metrics:
        # the trace p50 x1.65 at z = 0.9 over the bursts of a code-completion trace, TTFT p99 x1.75
        # from the histograms with overlapping intervals. The arrival rate, tested against its own
        # per-slice spread, carries it.
        (1240064, "load"),
        # A prompt template that defeats the prefix cache: hit rate 34 % -> 0 %, TTFT p50 x1.9 at
        # z = 1.7, TPOT p99 x1.84 within its noise.
        (1240152, "prefix_cache"),
        # num_gpu_blocks cut: 0 -> 30 preemptions (z = 3.8) while each running request came to hold
        # x12.5 of the cache at the same tokens, a pool that fills at its peaks (KV p90 34 %, max
        # 99 %). The preemption count and the pool agree; TTFT p99 x1.25 within its noise.
        (1230236, "kv_pressure"),
    ],
)
def test_a_mechanism_beyond_its_own_noise_makes_a_regression_of_a_latency_within_noise(
    seed: int, cause: str, tmp_path: Path
) -> None:
    report = _shared_report(seed, cause, tmp_path)
    assert report.regression.significant, report.regression
    assert "within the window's own noise" in report.regression.note, report.regression.note
    assert report.findings[0].cause == cause, report.findings


def test_what_would_explain_a_rise_within_noise_is_listed_after_none(tmp_path: Path) -> None:
    # Chunked prefill turned off on a canary beside its baseline (SGLang, 1,260 requests a side):
    # TPOT p99 x1.84 within its noise, no mechanism sure enough to make it a regression. "No
    # regression" stays first; the step shape that would explain the rise follows it, where the
    # report used to list nothing at all.
    report = _shared_report(1240298, "batch_composition", tmp_path)
    assert not report.regression.significant, report.regression
    causes = [f.cause for f in report.findings]
    assert causes[0] == "none", causes
    assert "batch_composition" in causes[1:3], causes
    assert any("within its noise" in note for note in report.notes), report.notes


@pytest.mark.parametrize(
    ("seed", "replica"),
    [
        # Decode x1.41 on replica-4 of four: +39 % at equal prompt size on its own (z = 8.5), the others
        # +0.6 %, pooled +5.7 %, below the pooled bar of 10 %; the ITL histogram's p99 crossed a
        # bucket edge (x2.5) and "no rule explains the regression".
        (1250079, "replica-4"),
        # The same on replica-1, whose running batch grew more than its peers' because its requests
        # stayed longer (the router gave it no more of them): the size-only comparison was vetoed
        # as if it had been given more load.
        (1250068, "replica-1"),
    ],
)
def test_one_replicas_slower_decode_below_the_pooled_bar_is_found_on_that_replica(
    seed: int, replica: str, tmp_path: Path
) -> None:
    report = _shared_report(seed, "decode_slowdown", tmp_path)
    assert report.findings, "no finding at all"
    top = report.findings[0]
    assert top.cause == "decode_slowdown", report.findings
    assert top.scope.get("host.name") == replica, top.scope


@pytest.mark.parametrize("seed", [1270080, 1270155])
def test_decodes_stalled_behind_costlier_prompts_are_a_prefill_slowdown(seed: int, tmp_path: Path) -> None:
    # A prefill path x2.8-3.2 on a busy fleet: decodes beside the prompts stall (ITL p99 x24-56 at a
    # steady median), as with chunked prefill turned off, and the batch grew so much that no
    # equal-batch bucket was left to show the costlier prefill. The step fit still shows each prompt
    # token costing more in the steps it shares (g x2.4), which whole-prompt scheduling does not do.
    report = _shared_report(seed, "prefill_slowdown", tmp_path)
    assert report.findings[0].cause == "prefill_slowdown", [(f.cause, f.title) for f in report.findings[:3]]


@pytest.mark.parametrize(("seed", "cause"), [(1270201, "prefill_slowdown"), (1260011, "load"), (1270244, "capacity")])
def test_a_rolling_restart_is_compared_once_the_rollout_finished(seed: int, cause: str, tmp_path: Path) -> None:
    # While replicas restart one by one both versions serve: the old one's requests in the candidate
    # window were a "slice" that did not regress (the prefill slowdown scoped to the new version and
    # read as the mix), diluted a surge, and kept the old max_num_seqs in the running gauge's peak.
    report = _shared_report(seed, cause, tmp_path)
    assert any(n.startswith("rolling deploy: ") for n in report.notes), report.notes
    assert report.findings[0].cause == cause, [(f.cause, f.title) for f in report.findings[:3]]
    assert "service.version" not in report.findings[0].scope


def test_requests_waiting_below_the_replicas_peak_are_no_running_cap(tmp_path: Path) -> None:
    # A step budget cut 16384 -> 256 on SGLang: queues of 4-23 requests wait at 2-4 running on
    # replicas that ran 5-6 between them, and the running peak fell 18 -> 6. A cap on running
    # requests holds requests back only while every slot is taken; these wait to be admitted.
    report = _shared_report(1260201, "batch_composition", tmp_path)
    assert report.findings[0].cause == "batch_composition", [(f.cause, f.title) for f in report.findings[:3]]
    assert "waited to be admitted" in report.findings[0].title


def test_a_running_peak_that_fell_by_chance_on_a_canary_is_no_cap(tmp_path: Path) -> None:
    # A version bump on one of two replicas: the canary's peak 11 -> 8 running, with 3 requests
    # waiting at two scrapes, at 5 and 6 running. Not a lower max_num_seqs.
    incident = generate(1270143, SHARED_TRACES, max_per_side=1200)
    assert incident.truth.cause == "none", incident.truth
    info, selection = replay_into_store(incident, tmp_path / "store.duckdb")
    assert info["visible"], info["effect"]  # scored by the benchmark: no latency apart beyond noise
    report = diagnose(tmp_path / "store.duckdb", selection)
    assert all(f.cause != "capacity" or f.rule == "stages" for f in report.findings), [
        (f.cause, f.rule, f.title) for f in report.findings[:3]
    ]


def test_arrivals_risen_within_noise_are_named_beside_a_slower_step(tmp_path: Path) -> None:
    # Metrics only, a rolling restart with arrivals x1.34 at the deploy: the window's arrivals rose
    # 26 % at z 2.9, short of the bar a measured rise needs, and the mean ITL rose 25 % with the
    # running batch. More arrivals and a slower step both grow the batch; the gauges cannot tell
    # them apart, so the load is named too instead of "at the same load" for the decode alone.
    report = _shared_report(1270283, "load", tmp_path)
    causes = [f.cause for f in report.findings[:2]]
    assert "load" in causes, [(f.cause, f.title) for f in report.findings[:3]]


def test_a_decode_slowdown_keeps_the_rise_a_noisy_step_fit_gives_to_prefill(tmp_path: Path) -> None:
    # Decode x1.45 on a saturating fleet (spans only): TPOT +21 % at equal batch (z 3.8), prefill
    # per token flat. The step fit split the rise about evenly between decode work and costlier
    # prefill in the same steps, but bounded that prefill cost's rise at +0.02 %: the split is its
    # point estimate, and the queue is the decode's.
    report = _shared_report(1260284, "decode_slowdown", tmp_path)
    assert report.findings[0].cause == "decode_slowdown", [(f.cause, f.title) for f in report.findings[:3]]


def test_a_replica_removed_makes_a_regression_of_a_tail_within_its_noise(tmp_path: Path) -> None:
    # 1 of 4 SGLang replicas removed at a hot swap: e2e p99 x1.46, its CI above zero but short of
    # the family-wise bar, read "no regression" with capacity second. Replicas are counted, with
    # no noise of their own, so the removal makes the regression (diagnosis.mechanism_finding).
    report = _shared_report(1270129, "capacity", tmp_path)
    assert report.regression.significant, report.regression
    assert report.findings[0].cause == "capacity", [(f.cause, f.title) for f in report.findings[:3]]


def test_prompts_sharing_steps_with_prefill_the_cache_stopped_serving_are_the_caches(tmp_path: Path) -> None:
    # Prefix caching turned off in a rolling restart (vLLM V1): the counters' hit rate 16 % -> 0,
    # uncached prompt tokens per request x1.18, under the 20 % work bar of batch_composition's
    # "prompts spread over more steps" reading, which led. The cache's own bar (5 points and 10 %)
    # says whose the extra prefill in every step is.
    report = _shared_report(1230021, "prefix_cache", tmp_path)
    assert report.findings[0].cause == "prefix_cache", [(f.cause, f.title) for f in report.findings[:3]]


@pytest.mark.parametrize("seed", [1280001, 1280290])
def test_a_metric_quantile_in_its_sides_last_bucket_is_not_read_as_independent_draws(seed: int, tmp_path: Path) -> None:
    # Healthy deploys with gateway spans and engine metrics. The candidate's ITL p99 (1280001) and
    # TTFT p99 (1280290) sat in the last bucket their side reached: nothing above it, and the share
    # above it (0) had read as "every observation independent", so a 95 % interval one bucket wide
    # lay apart from the baseline's. Read at the bucket's lower edge they rest on a few hundred.
    report = _shared_report(seed, "none", tmp_path)
    assert not report.regression.significant, report.regression
    assert report.findings[0].cause == "none", [(f.cause, f.title) for f in report.findings[:3]]


@pytest.mark.parametrize("seed", [1280270, 1290217])
def test_prefill_that_waited_for_slower_decode_steps_is_the_decodes(seed: int, tmp_path: Path) -> None:
    # vLLM V0, decode x2 in a rolling restart of a saturated fleet (about 0.3 preemptions per
    # request): prefill per uncached token rose +120 % at equal batch, more than TPOT (+80 %), and
    # led. The step fit puts the TPOT rise in decode work and cannot show a prompt token surely
    # 10 % costlier in a step, so the prefill rise is the slower steps' echo.
    report = _shared_report(seed, "decode_slowdown", tmp_path)
    assert report.findings[0].cause == "decode_slowdown", [(f.cause, f.title) for f in report.findings[:3]]


def test_one_replica_of_six_decoding_slower_is_found_from_metrics_alone(tmp_path: Path) -> None:
    # Engine metrics only: decode x2.07 on replica-5 of 6. The fleet's ITL p99 rose x2.4, its mean
    # 14 %, under the 15 % a fleet-wide reading needs, and nothing explained the regression. The
    # replica's own ITL mean doubled while its closest peer's moved 2 %: that replica's decode.
    report = _shared_report(1280181, "decode_slowdown", tmp_path)
    top = report.findings[0]
    assert top.cause == "decode_slowdown", [(f.cause, f.title) for f in report.findings[:3]]
    assert top.scope == {"host.name": "replica-5"}, top.scope


def test_a_running_peak_that_fell_with_the_step_budget_is_the_budgets(tmp_path: Path) -> None:
    # max_num_batched_tokens 8192 -> 512 in a rolling restart: the largest steps fell from the
    # 8192 bucket to the 512 one and the running gauge's peak 20 -> 18 with requests waiting, and
    # "capacity: max running requests 20 -> 18" led the budget's own finding. A cut of
    # max_num_seqs leaves the largest steps where the budget pins them; this one moved them.
    report = _shared_report(1300034, "batch_composition", tmp_path)
    assert report.findings[0].cause == "batch_composition", [(f.cause, f.title) for f in report.findings[:3]]


def test_a_running_cap_that_held_requests_back_is_a_regression_even_when_batches_got_faster(
    tmp_path: Path,
) -> None:
    # vLLM V0, max_num_seqs 128 -> 6 at a hot swap: smaller batches decode faster, e2e p99 x0.93,
    # while requests queued at the new cap (running peak 26 -> 6 with requests waiting). The
    # queueing rule's tested cap read 0.9, but only a count of replicas could make a regression
    # of a latency that rose within its noise: "no regression", the cap listed after it.
    report = _shared_report(1300226, "capacity", tmp_path)
    assert report.regression.significant
    assert report.findings[0].cause == "capacity", [(f.cause, f.title) for f in report.findings[:3]]


def test_a_mean_itl_that_rose_with_the_batch_is_not_a_slower_step(tmp_path: Path) -> None:
    # Engine metrics only, a healthy hot swap on Azure's code trace: arrivals up 26 % within the
    # bursts' spread, running per replica x1.37 and the mean ITL x1.29 with it, read as a decode
    # slowdown "at the same load". The baseline's per-interval step (ITL against running batch and
    # prompt tokens per second) predicts the candidate's ITL within 3 %.
    report = _shared_report(1280068, "none", tmp_path)
    assert report.findings[0].cause == "none", [(f.cause, f.title) for f in report.findings[:3]]
    assert "decode_slowdown" not in [f.cause for f in report.findings]


def test_a_slower_step_is_the_decode_even_where_recomputed_prompts_count_as_more_work(tmp_path: Path) -> None:
    # Engine metrics only, decode x3.93 in a rolling restart: preemptions rose with the longer
    # decodes and recomputed prompts counted 22 % more tokens per request, which had blocked the
    # decode reading and left KV pressure at 0.2. At the baseline's batch and prefill the step is
    # x3.2 slower (z 10).
    report = _shared_report(1280087, "decode_slowdown", tmp_path)
    assert report.findings[0].cause == "decode_slowdown", [(f.cause, f.title) for f in report.findings[:3]]


def test_steps_above_every_baseline_step_are_chunked_prefill_turned_off(tmp_path: Path) -> None:
    # vLLM V1, chunked prefill off on Mooncake: 740 baseline steps at the 8192 bound and none
    # above it, hundreds of candidate steps above it in every scrape interval, the p99 step
    # unchanged (most steps are decodes). The stall reading alone (TPOT p99 x1.84) read 0.33:
    # "no regression" over it.
    report = _shared_report(1340076, "batch_composition", tmp_path)
    assert report.findings[0].cause == "batch_composition", [(f.cause, f.title) for f in report.findings[:3]]
    assert any(e.signal == "steps_above_baseline_largest" for e in report.findings[0].evidence)


def test_a_canary_decode_slowdown_with_less_prefill_per_request_leads(tmp_path: Path) -> None:
    # A canary split on Azure's code trace, decode x3.52 on the new version: TPOT at equal batch
    # +70 % at z 10.7, damped to 0.12 because the candidate's uncached prompt tokens per request
    # were x0.81 (less prefill per step can only hide a decode slowdown), below the stage fallback.
    report = _shared_report(1340161, "decode_slowdown", tmp_path)
    assert report.findings[0].cause == "decode_slowdown", [(f.cause, f.title) for f in report.findings[:3]]


@pytest.mark.parametrize("seed", [1340103, 1340198])
def test_retries_that_silence_the_engine_are_still_compared(seed: int, tmp_path: Path) -> None:
    # A new gateway retrying after a short timeout aborts engine requests, which then export no
    # span: no engine span started for minutes after the deploy while the gateway's attempts did.
    # Taken for a restart's dead time, the windows shrank to seconds ("no regression").
    report = _shared_report(seed, "retry_amplification", tmp_path)
    assert report.findings[0].cause == "retry_amplification", [(f.cause, f.title) for f in report.findings[:3]]
    assert any("while the gateway kept receiving requests" in n for n in report.notes)


def test_a_smaller_budget_that_admits_slower_is_not_a_slower_decode(tmp_path: Path) -> None:
    # SGLang chunked_prefill_size 8192 -> 256 on Azure's code trace: fewer requests ran at the
    # same load (6.1 -> 2.2 per replica), requests waited below the replicas' peak, and a prompt
    # chunk in most steps lifted the median inter-token step x1.65, read as decode_slowdown.
    report = _shared_report(1340217, "batch_composition", tmp_path)
    assert report.findings[0].cause == "batch_composition", [(f.cause, f.title) for f in report.findings[:3]]
    assert "decode_slowdown" not in [f.cause for f in report.findings[:2]]


def test_stalls_that_shrank_beside_bigger_steps_are_no_smaller_budget(tmp_path: Path) -> None:
    # vLLM V1, max_num_seqs 256 -> 9 in a rolling restart: fewer decodes beside each prompt chunk
    # shrank the TPOT tail (x0.36) while requests queued, which read as "a smaller step budget"
    # at 0.56; but the largest steps stayed at the 8192 bound and the p99 step rose x2.96. A
    # smaller budget cannot make steps bigger.
    report = _shared_report(1340102, "capacity", tmp_path)
    assert report.findings[0].cause == "capacity", [(f.cause, f.title) for f in report.findings[:3]]


def test_inter_token_intervals_that_rose_while_the_stalls_shrank_are_a_smaller_budget(tmp_path: Path) -> None:
    # SGLang max_num_batched_tokens 8192 -> 512 in a rolling restart: the metric stream's ITL p90
    # rose x3.24 (a prompt chunk in more of the steps) while the requests' TPOT p99 fell x0.16 (no
    # step carries a whole prompt any more): "no rule explains the regression".
    report = _shared_report(1340252, "batch_composition", tmp_path)
    assert report.findings[0].cause == "batch_composition", [(f.cause, f.title) for f in report.findings[:3]]
