"""Config precedence: flags > SRE_AGENT_* environment > TOML file > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from sre_agent.config import Config, load_config
from sre_agent.errors import ConfigError


def test_defaults_match_the_contract() -> None:
    config = Config()
    assert (config.http_port, config.grpc_port) == (4318, 4317)
    assert config.db == "./sre-agent.duckdb"
    assert config.max_body_bytes == 64 * 1024 * 1024
    assert config.keep_content is False


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    toml = tmp_path / "sre-agent.toml"
    toml.write_text('db = "from-file.duckdb"\nhttp_port = 1111\ngrpc_port = 2222\nkeep_content = true\n')
    env = {"SRE_AGENT_HTTP_PORT": "3333", "SRE_AGENT_DB": "from-env.duckdb"}
    config = load_config({"db": "from-flag.duckdb", "grpc_port": None}, env=env, file=toml)
    assert config.db == "from-flag.duckdb"  # flag wins
    assert config.http_port == 3333  # env beats file
    assert config.grpc_port == 2222  # None flag does not override the file
    assert config.keep_content is True  # file beats default


def test_unknown_key_in_file_is_rejected_with_a_suggestion(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text("http_prot = 1\n")
    with pytest.raises(ConfigError, match="did you mean 'http_port'"):
        load_config(env={}, file=toml)


def test_unknown_environment_variable_is_rejected() -> None:
    with pytest.raises(ConfigError, match="SRE_AGENT_GRPC_PROT"):
        load_config(env={"SRE_AGENT_GRPC_PROT": "1"})


def test_bad_value_names_its_source() -> None:
    with pytest.raises(ConfigError, match="SRE_AGENT_HTTP_PORT"):
        load_config(env={"SRE_AGENT_HTTP_PORT": "many"})


def test_config_file_from_environment_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a file"):
        load_config(env={"SRE_AGENT_CONFIG": str(tmp_path / "missing.toml")})


def test_tenant_tokens_from_environment() -> None:
    config = load_config(env={"SRE_AGENT_TENANT_TOKENS": "t1=acme,t2=globex"})
    assert config.tenant_tokens == {"t1": "acme", "t2": "globex"}


def test_the_store_setting_names_duckdb_or_clickhouse(tmp_path: Path) -> None:
    assert load_config(env={}, file=None).clickhouse is None
    env = {"SRE_AGENT_STORE": "clickhouse://reader@ch:8123/otel", "SRE_AGENT_CLICKHOUSE_TRACES_TABLE": "traces"}
    config = load_config(env=env, file=None)
    assert config.clickhouse == "clickhouse://reader@ch:8123/otel"
    assert config.clickhouse_traces_table == "traces"
    local = load_config({"store": f"duckdb:{tmp_path / 'x.duckdb'}"}, env={}, file=None)
    assert local.clickhouse is None
    assert local.duckdb_path == str(tmp_path / "x.duckdb")
    with pytest.raises(ConfigError, match="use duckdb:PATH, chdb:PATH or clickhouse://"):
        load_config(env={"SRE_AGENT_STORE": "postgres://x"}, file=None)
