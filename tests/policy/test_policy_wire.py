"""Requests on the wire: one OpenAI-shaped conversation, translated per provider format."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sre_agent.policy import OutcomeClass, classify
from sre_agent.policy.wire import anthropic_messages, stream_accumulator


def test_anthropic_messages_translate_tool_turns_and_merge_consecutive_results() -> None:
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "file two tickets"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "t", "arguments": '{"n": 1}'}},
                {"id": "b", "type": "function", "function": {"name": "t", "arguments": "{broken"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": '{"id": 1}'},
        {"role": "tool", "tool_call_id": "b", "content": '{"error": "bad arguments"}'},
        {"role": "user", "content": "thanks"},
    ]
    out = anthropic_messages(conversation)
    assert [m["role"] for m in out] == ["user", "assistant", "user", "user"]  # the system prompt goes elsewhere
    assert out[1]["content"] == [
        {"type": "tool_use", "id": "a", "name": "t", "input": {"n": 1}},
        {"type": "tool_use", "id": "b", "name": "t", "input": {}},  # unparseable arguments: an empty input
    ]
    assert [b["tool_use_id"] for b in out[2]["content"]] == ["a", "b"]  # one message of results
    assert out[3] == {"role": "user", "content": "thanks"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
# Events shaped like the real ones, with any value in any field: the fields a provider could get wrong.
events = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["message_start", "content_block_start", "content_block_delta", "message_delta", "error", "x"]
        )
    },
    optional={
        "index": json_values,
        "message": json_values,
        "content_block": json_values,
        "delta": st.fixed_dictionaries(
            {"type": st.sampled_from(["text_delta", "thinking_delta", "input_json_delta", "y"])},
            optional={"text": json_values, "thinking": json_values, "partial_json": json_values},
        )
        | json_values,
        "usage": json_values,
        "error": json_values,
        "choices": json_values,
        "response": json_values,
    },
)
lines = st.one_of(
    events.map(lambda e: "data: " + json.dumps(e)),
    st.text(max_size=40),
    st.just("data: [DONE]"),
    st.just("data: {not json"),
)


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(["openai-chat", "openai-responses", "anthropic"]), stream=st.lists(lines, max_size=12))
def test_no_stream_of_lines_breaks_an_accumulator_or_the_classifier(fmt: str, stream: list[str]) -> None:
    accumulator = stream_accumulator(fmt)
    for line in stream:
        accumulator.feed_line(line)
    body = accumulator.body()
    assert isinstance(body, dict)
    outcome = classify(200, {}, body, provider_format=fmt)
    assert isinstance(outcome.cls, OutcomeClass)
