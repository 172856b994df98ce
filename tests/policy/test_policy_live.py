"""Compute allocation on live engines over real HTTP: a verified cascade from a cheap to a strong model."""

from __future__ import annotations

import httpx

from sre_agent.policy import AdaptiveSampling, BudgetLimits, ChatRequest, LiveSource, PolicyEngine, SingleRun, Target
from sre_agent.policy.game24 import check_answer
from sre_agent.replays.fault_server import Step

PUZZLE = "4 4 6 8"
WRONG = Step("ok", text="Answer: 4 * 6 = 24")
RIGHT = Step("ok", text="Answer: (4 + 8) * (6 - 4) = 24")
SCRIPTS = {
    "cheap-hard": [WRONG, Step("server_error"), WRONG, WRONG],
    "cheap-easy": [WRONG, RIGHT],
    "strong": [RIGHT],
    "strong-unused": [RIGHT],
}
REQUEST = ChatRequest(({"role": "user", "content": f"Use {PUZZLE} to make 24."},))


def _arms(base_url: str, cheap: str, strong: str) -> dict[str, tuple[PolicyEngine, ChatRequest]]:
    limits = BudgetLimits(max_attempts=3, deadline_s=30)
    return {
        "cheap": (PolicyEngine([Target(f"{base_url}/{cheap}/v1", "mini")], limits, sleep=lambda s: None), REQUEST),
        "strong": (PolicyEngine([Target(f"{base_url}/{strong}/v1", "big")], limits, sleep=lambda s: None), REQUEST),
    }


def _requests(base_url: str, scenario: str) -> int:
    return sum(1 for entry in httpx.get(f"{base_url}/_log").json() if entry["scenario"] == scenario)


def test_cascade_escalates_when_cheap_answers_fail_the_checker(base_url: str) -> None:
    cascade = AdaptiveSampling("cheap", max_n=3) + SingleRun("strong", verify=True)
    with httpx.Client() as client:
        source = LiveSource(
            client,
            _arms(base_url, "cheap-hard", "strong"),
            verifier=lambda text: check_answer(PUZZLE, text),
            deadline_s=60,
        )
        result = cascade.run(source)
    assert result.verified
    assert result.draw is not None
    assert result.draw.arm == "strong"
    assert _requests(base_url, "cheap-hard") == 4  # 3 logical requests, one retried after a 503
    assert len(result.draws) == 4


def test_cascade_stops_at_the_first_verified_cheap_answer(base_url: str) -> None:
    cascade = AdaptiveSampling("cheap", max_n=3) + SingleRun("strong", verify=True)
    with httpx.Client() as client:
        source = LiveSource(
            client, _arms(base_url, "cheap-easy", "strong-unused"), verifier=lambda t: check_answer(PUZZLE, t)
        )
        result = cascade.run(source)
    assert result.verified
    assert result.draw is not None
    assert result.draw.arm == "cheap"
    assert _requests(base_url, "strong-unused") == 0
