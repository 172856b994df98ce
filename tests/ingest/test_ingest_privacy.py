"""Content attributes and over-long values are stored as length + keyed hash by default."""

from __future__ import annotations

import hashlib
import hmac
import json

from otlp_builders import otlp_json, trace_request

from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_traces
from sre_agent.store.embedded import Store

SECRET = "my social security number is 078-05-1120"
MESSAGES = json.dumps([{"role": "user", "parts": [{"type": "text", "content": SECRET}]}])
BIG = "A" * (1024 * 1024)
KEY = b"privacy-test-key"


def _request() -> bytes:
    attributes = {
        "gen_ai.input.messages": MESSAGES,
        "gen_ai.output.messages": ["not", "an", SECRET],
        "big.attribute": BIG,
        "gen_ai.request.model": "llama",
        "ok.attribute": "short and fine",
    }
    return trace_request([{"attributes": attributes}]).SerializeToString()


def _expected_redaction(value: str) -> str:
    data = value.encode()
    return f"redacted:len={len(data)}:hmac={hmac.new(KEY, data, hashlib.sha256).hexdigest()[:16]}"


def test_default_redacts_content_and_long_values(tmp_path) -> None:
    norm = Normaliser(hash_key=KEY)
    decoded = decode_traces(_request(), "application/x-protobuf", normaliser=norm)
    with Store.open(tmp_path / "p.duckdb") as store:
        store.append_spans(decoded.table)
        rows = store.connection.execute("SELECT attributes::VARCHAR, attributes FROM spans").fetchall()
    text, attributes = rows[0]
    assert SECRET not in text
    assert "AAAAAAAAAAAAAAAA" not in text
    assert attributes["gen_ai.input.messages"] == _expected_redaction(MESSAGES)
    assert attributes["big.attribute"] == _expected_redaction(BIG)
    assert attributes["big.attribute"].startswith(f"redacted:len={1024 * 1024}:hmac=")
    assert attributes["gen_ai.output.messages"].startswith("redacted:len=")
    assert attributes["ok.attribute"] == "short and fine"
    assert attributes["gen_ai.request.model"] == "llama"


def test_same_value_same_hash_different_key_different_hash() -> None:
    a = Normaliser(hash_key=b"one")
    b = Normaliser(hash_key=b"two")
    assert a.redact(SECRET) == a.redact(SECRET)
    assert a.redact(SECRET) != b.redact(SECRET)
    assert a.redact(SECRET) != a.redact(SECRET + "!")


def test_keep_content_keeps_both_verbatim() -> None:
    norm = Normaliser(keep_content=True, hash_key=KEY)
    (row,) = decode_traces(_request(), "application/x-protobuf", normaliser=norm).table.to_pylist()
    attributes = dict(row["attributes"])
    assert attributes["gen_ai.input.messages"] == MESSAGES
    assert attributes["big.attribute"] == BIG


def test_limit_counts_utf8_bytes_not_characters() -> None:
    norm = Normaliser(max_attribute_bytes=10, hash_key=KEY)
    request = trace_request([{"attributes": {"ascii": "x" * 10, "wide": "é" * 6, "resource_too": "ok"}}])
    (row,) = decode_traces(request.SerializeToString(), "application/x-protobuf", normaliser=norm).table.to_pylist()
    attributes = dict(row["attributes"])
    assert attributes["ascii"] == "x" * 10
    assert attributes["wide"] == _expected_redaction("é" * 6)
    assert attributes["wide"].startswith("redacted:len=12:")


def test_resource_attributes_and_json_path_are_redacted_too() -> None:
    norm = Normaliser(max_attribute_bytes=64, hash_key=KEY)
    request = trace_request(
        [{"attributes": {"gen_ai.prompt": SECRET}}], resource={"service.name": "s", "blob": "b" * 100}
    )
    body = json.dumps(otlp_json(request)).encode()
    (row,) = decode_traces(body, "application/json", normaliser=norm).table.to_pylist()
    assert dict(row["resource_attributes"])["blob"] == _expected_redaction("b" * 100)
    assert dict(row["attributes"])["gen_ai.prompt"] == _expected_redaction(SECRET)


def test_store_keeps_one_random_hash_key(tmp_path) -> None:
    path = tmp_path / "k.duckdb"
    with Store.open(path) as store:
        key = store.hash_key
    with Store.open(path) as store:
        assert store.hash_key == key
    with Store.open(tmp_path / "other.duckdb") as other:
        assert other.hash_key != key
    assert len(key) == 32
