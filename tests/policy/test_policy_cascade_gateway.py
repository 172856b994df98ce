"""A fitted single-outcome cascade run by the gateway over real HTTP (the fault server on 127.0.0.1)."""

from __future__ import annotations

import json

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sre_agent.policy import (
    BudgetLimits,
    ChatRequest,
    LiveSource,
    PolicyEngine,
    Pricing,
    SingleRun,
    Target,
    load_allocators,
)
from sre_agent.policy.allocate import Allocator
from sre_agent.policy.evaluate import ArmHistory, Replay, parse_tasks, split_tasks, summarize
from sre_agent.policy.game24 import check_answer
from sre_agent.policy.single import fit_single_outcome
from sre_agent.policy.specs import save_allocators
from sre_agent.policy.tables import ArmSpec, synthetic_tasks
from sre_agent.replays.fault_server import Step

PUZZLE = "4 4 6 8"
WRONG = Step("ok", text="Answer: 4 * 6 = 24")
RIGHT = Step("ok", text="Answer: (4 + 8) * (6 - 4) = 24")
SCRIPTS = {
    "cheap-wrong": [WRONG],
    "cheap-right": [RIGHT],
    "strong": [RIGHT],
    "strong-unaffordable": [RIGHT],
    "strong-slow": [RIGHT],
}
REQUEST = ChatRequest(({"role": "user", "content": f"Use {PUZZLE} to make 24."},), max_output_tokens=200)
CHEAP = Pricing(input_per_mtok=1.0, output_per_mtok=4.0)
STRONG = Pricing(input_per_mtok=50.0, output_per_mtok=200.0)  # 50x the cheap model's prices
VERIFIER_USD = 0.0001


@pytest.fixture(scope="module")
def fitted_cascade(tmp_path_factory: pytest.TempPathFactory) -> Allocator:
    """The cascade fitted offline on a synthetic single-outcome table with the gateway's arm names,
    handed to the gateway as JSON (saved, then loaded) as a deployment would."""
    arms = (ArmSpec("cheap", 0.3, 0.001, 2.0), ArmSpec("strong", 0.6, 0.05, 8.0))
    rows = synthetic_tasks(400, seed=7, arms=arms)
    train, _ = split_tasks(parse_tasks([json.dumps(r) for r in rows]), 0.5)
    replay = Replay(ArmHistory.from_tasks(train), 60.0, None)
    target = summarize("single:strong", "fixed", replay.runs(SingleRun("strong"), train))
    saved = tmp_path_factory.mktemp("fitted") / "fitted.json"
    save_allocators({"cascade": fit_single_outcome(train, replay, target)["cascade"].policy}, saved)
    return load_allocators(saved)["cascade"]


def _source(
    base_url: str,
    client: httpx.Client,
    cheap: str,
    strong: str,
    provider: TracerProvider,
    *,
    budget_usd: float = 0.05,
    deadline_s: float = 30.0,
    strong_latency_s: float = 1.0,
) -> LiveSource:
    tracer = provider.get_tracer("test")
    limits = BudgetLimits(max_attempts=2, deadline_s=deadline_s)

    def engine(scenario: str, model: str, pricing: Pricing, latency_s: float) -> PolicyEngine:
        target = Target(f"{base_url}/{scenario}/v1", model, pricing=pricing, expected_latency_s=latency_s)
        return PolicyEngine([target], limits, sleep=lambda s: None, tracer=tracer)

    return LiveSource(
        client,
        {
            "cheap": (engine(cheap, "mini", CHEAP, 0.5), REQUEST),
            "strong": (engine(strong, "big", STRONG, strong_latency_s), REQUEST),
        },
        verifier=lambda text: check_answer(PUZZLE, text),
        verifier_cost_usd=VERIFIER_USD,
        deadline_s=deadline_s,
        budget_usd=budget_usd,
        tracer=tracer,
    )


def _requests(base_url: str, scenario: str) -> int:
    return sum(1 for entry in httpx.get(f"{base_url}/_log").json() if entry["scenario"] == scenario)


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_the_fitted_cascade_is_cheap_first_and_verifies_before_escalating(fitted_cascade: Allocator) -> None:
    assert fitted_cascade.name == "single:cheap:verified + single:strong"


def test_verifier_rejection_escalates_to_the_strong_target_within_deadline_and_budget(
    base_url: str, spans: tuple[InMemorySpanExporter, TracerProvider], fitted_cascade: Allocator
) -> None:
    exporter, provider = spans
    with httpx.Client() as client:
        source = _source(base_url, client, "cheap-wrong", "strong", provider)
        result = source.run(fitted_cascade)
    assert result.draw is not None
    assert result.draw.arm == "strong"
    assert check_answer(PUZZLE, result.draw.answer)
    assert [d.arm for d in result.draws] == ["cheap", "strong"]
    assert _requests(base_url, "cheap-wrong") == 1
    assert _requests(base_url, "strong") == 1
    assert source.spend_usd <= 0.05
    assert source.verifier_usd == pytest.approx(VERIFIER_USD)
    assert source.spend_usd == pytest.approx(sum(d.cost_usd for d in result.draws) + VERIFIER_USD)
    assert result.draws[1].cost_usd > 20 * result.draws[0].cost_usd  # the strong model's prices
    assert source.elapsed_s <= 30.0
    (root,) = _named(exporter, "policy.allocate")
    assert root.attributes["sre_agent.policy.arm"] == "strong"  # type: ignore[index]
    assert root.attributes["sre_agent.policy.cost_usd"] == pytest.approx(source.spend_usd)  # type: ignore[index]
    draws = _named(exporter, "policy.allocate.draw")
    assert [s.attributes["sre_agent.policy.arm"] for s in draws] == ["cheap", "strong"]  # type: ignore[index]
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in draws)
    (verify,) = _named(exporter, "policy.allocate.verify")
    assert verify.attributes["sre_agent.policy.verdicts"] == (False,)  # type: ignore[index]
    requests = _named(exporter, "policy.request")
    assert {s.parent.span_id for s in requests if s.parent} == {s.context.span_id for s in draws}
    attempts = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert [s.attributes["gen_ai.request.model"] for s in attempts] == ["mini", "big"]  # type: ignore[index]


def test_a_verified_cheap_answer_never_calls_the_strong_target(
    base_url: str, spans: tuple[InMemorySpanExporter, TracerProvider], fitted_cascade: Allocator
) -> None:
    _, provider = spans
    before = _requests(base_url, "strong")
    with httpx.Client() as client:
        result = _source(base_url, client, "cheap-right", "strong", provider).run(fitted_cascade)
    assert result.verified
    assert result.draw is not None
    assert result.draw.arm == "cheap"
    assert _requests(base_url, "strong") == before


def test_the_dollar_budget_stops_escalation_before_the_strong_call(
    base_url: str, spans: tuple[InMemorySpanExporter, TracerProvider], fitted_cascade: Allocator
) -> None:
    _, provider = spans
    with httpx.Client() as client:
        # Enough for the cheap call and its verification, far too little for the strong model's prompt.
        source = _source(base_url, client, "cheap-wrong", "strong-unaffordable", provider, budget_usd=0.0003)
        result = source.run(fitted_cascade)
    assert _requests(base_url, "strong-unaffordable") == 0
    assert result.draw is not None
    assert result.draw.arm == "cheap"
    assert result.flagged
    assert not result.verified
    assert source.spend_usd <= 0.0003


def test_a_strong_stage_that_cannot_meet_the_deadline_is_skipped(
    base_url: str, spans: tuple[InMemorySpanExporter, TracerProvider], fitted_cascade: Allocator
) -> None:
    _, provider = spans
    with httpx.Client() as client:
        source = _source(base_url, client, "cheap-wrong", "strong-slow", provider, deadline_s=5.0, strong_latency_s=60)
        result = source.run(fitted_cascade)
    assert _requests(base_url, "strong-slow") == 0
    assert result.draw is not None
    assert result.draw.arm == "cheap"
    assert result.flagged
