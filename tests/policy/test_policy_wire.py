"""Requests on the wire: one OpenAI-shaped conversation, translated per provider format."""

from __future__ import annotations

from sre_agent.policy.wire import anthropic_messages


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
