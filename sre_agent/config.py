"""One typed configuration object with a documented precedence.

Precedence, highest first: command-line flags > environment variables
``SRE_AGENT_<KEY>`` (upper case) > the TOML file > defaults. The TOML file is
``$SRE_AGENT_CONFIG`` if set, else ``./sre-agent.toml`` if present, else
``~/.config/sre-agent/config.toml`` if present. Unknown keys are rejected
with a suggestion, so a typo never silently falls back to a default.

Example ``sre-agent.toml``::

    db = "/var/lib/sre-agent/store.duckdb"
    # or read where OTel Collectors write (analysis only): chdb:PATH or clickhouse://user@host:8123/db
    # store = "clickhouse://default@clickhouse:8123/otel"
    http_port = 4318
    grpc_port = 4317
    keep_content = false
    retention_days = 14
    scrape_interval_s = 5

    [[scrape]]                       # engine /metrics pulled by `serve` (repeatable)
    url = "http://127.0.0.1:8000/metrics"
    service = "vllm"                 # service.name (default: the metric prefix, vllm or sglang)
    instance = "vllm-0"              # service.instance.id (default: host:port of the URL)
    host = "node-1"                  # host.name (default: the URL's host)
    version = "v1"                   # service.version (default: none)

``SRE_AGENT_SCRAPE`` takes comma-separated URLs (defaults for the rest).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from sre_agent.errors import ConfigError

__all__ = ["STORE_PREFIXES", "Config", "ScrapeTarget", "load_config", "scrape_targets"]

MiB = 1024 * 1024


@dataclass(frozen=True)
class ScrapeTarget:
    """A Prometheus ``/metrics`` endpoint that ``serve`` pulls engine metrics from.

    The points land labelled like a Collector's would: the resource carries
    ``service.name``, ``service.instance.id`` and ``host.name`` (and
    ``service.version`` when given), so they join the engine's spans when
    those carry the same values.

    Attributes:
        url: ``http://`` or ``https://`` URL of the exposition text.
        service: ``service.name`` (``None`` = the metric prefix, ``vllm`` or ``sglang``).
        instance: ``service.instance.id`` (``None`` = ``host:port`` of the URL, as a Collector sets it).
        host: ``host.name`` (``None`` = the URL's host).
        version: ``service.version`` (``None`` = not set).
    """

    url: str
    service: str | None = None
    instance: str | None = None
    host: str | None = None
    version: str | None = None

    @property
    def address(self) -> str:
        """``host:port`` of the URL (the port defaults to the scheme's)."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def instance_id(self) -> str:
        """The ``service.instance.id`` the points carry."""
        return self.instance or self.address

    @property
    def host_name(self) -> str:
        """The ``host.name`` the points carry."""
        return self.host or (urlsplit(self.url).hostname or "")


_SCRAPE_KEYS = frozenset(f.name for f in fields(ScrapeTarget))


def _scrape_target(value: Any, source: str) -> ScrapeTarget:
    """One target from a URL string or a ``[[scrape]]`` table; rejects what cannot be scraped."""
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: scrape = {value!r} is neither a URL nor a table with url = ...")
    unknown = sorted(set(value) - _SCRAPE_KEYS)
    if unknown:
        hint = difflib.get_close_matches(unknown[0], sorted(_SCRAPE_KEYS), n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"{source}: unknown [[scrape]] setting {unknown[0]!r}{suggestion}")
    if "url" not in value:
        raise ConfigError(f"{source}: a [[scrape]] table needs url = ...")
    items = {k: str(v) for k, v in value.items()}
    url = items["url"].strip()
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{source}: scrape URL {url!r} is not an http:// or https:// URL with a host")
    items["url"] = url
    return ScrapeTarget(**items)


def scrape_targets(value: Any, source: str) -> tuple[ScrapeTarget, ...]:
    """Targets from a TOML value (a table, a URL or a list of either) or comma-separated URLs."""
    if isinstance(value, ScrapeTarget):
        return (value,)
    if isinstance(value, str):
        value = [item for item in value.replace("\n", ",").split(",") if item.strip()]
    elif isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{source}: scrape = {value!r} is not a list of URLs or [[scrape]] tables")
    return tuple(t if isinstance(t, ScrapeTarget) else _scrape_target(t, source) for t in value)


#: The stores ``store`` may name (see :class:`Config`).
STORE_PREFIXES: Final[tuple[str, ...]] = ("duckdb:", "chdb:", "clickhouse://", "clickhouses://")


@dataclass(frozen=True)
class Config:
    """Settings shared by every command.

    Attributes:
        db: path of the DuckDB store file.
        store: where the analysis reads: ``duckdb:PATH`` (= ``db``), ``chdb:PATH`` or
            ``clickhouse://user:password@host:8123/db`` (the OTel Collector ClickHouse
            exporter's tables; ``None`` = ``db``).
        clickhouse_traces_table: the exporter's ``traces_table_name``.
        clickhouse_metrics_table: the exporter's ``metrics_table_name`` (``_gauge``, ``_sum``,
            ``_histogram`` are appended, as the exporter does).
        url: base URL of a running ``sre-agent serve`` (``None`` = use ``db``).
        host: address the receivers bind to.
        http_port: OTLP/HTTP and API port (4318 is the OTLP default).
        grpc_port: OTLP/gRPC port (4317 is the OTLP default); 0 disables gRPC.
        token: bearer token required by the API and receivers (``None`` = open).
        tenant_tokens: token -> tenant.id for tenant-scoped read tokens.
        keep_content: keep prompt/completion content attributes verbatim.
        max_attribute_bytes: attribute values longer than this are hashed.
        max_body_bytes: request body cap after decompression, bytes.
        queue_max_spans: receiver queue bound, in spans, before 429/503.
        batch_max_spans: largest batch committed to DuckDB in one append.
        flush_interval_s: longest time a span waits in the queue before commit.
        retention_days: delete data older than this many days (``None`` = keep).
        hash_key: key for content hashes (``None`` = a random key kept in the store).
        scrape: Prometheus endpoints ``serve`` pulls engine metrics from (``[[scrape]]``).
        scrape_interval_s: seconds between two scrapes of a target.
    """

    db: str = "./sre-agent.duckdb"
    store: str | None = None
    clickhouse_traces_table: str = "otel_traces"
    clickhouse_metrics_table: str = "otel_metrics"
    url: str | None = None
    host: str = "127.0.0.1"
    http_port: int = 4318
    grpc_port: int = 4317
    token: str | None = None
    tenant_tokens: dict[str, str] = dataclasses.field(default_factory=dict)
    keep_content: bool = False
    max_attribute_bytes: int = 4096
    max_body_bytes: int = 64 * MiB
    queue_max_spans: int = 200_000
    batch_max_spans: int = 50_000
    flush_interval_s: float = 0.05
    retention_days: float | None = None
    hash_key: str | None = None
    scrape: tuple[ScrapeTarget, ...] = ()
    scrape_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.store is not None and not self.store.startswith(
            ("duckdb:", "chdb:", "clickhouse://", "clickhouses://")
        ):
            raise ConfigError(f"store = {self.store!r}: use duckdb:PATH, chdb:PATH or clickhouse://user@host:8123/db")
        if not self.scrape_interval_s > 0:  # also rejects NaN
            raise ConfigError(f"scrape_interval_s = {self.scrape_interval_s!r} must be a positive number of seconds")

    @property
    def clickhouse(self) -> str | None:
        """The ClickHouse store (``chdb:PATH`` or ``clickhouse://...``) when ``store`` names one, else None."""
        if self.store is None or self.store.startswith("duckdb:"):
            return None
        return self.store

    @property
    def duckdb_path(self) -> str:
        """The DuckDB store file: ``store``'s path when it is ``duckdb:PATH``, else ``db``."""
        if self.store is not None and self.store.startswith("duckdb:"):
            return self.store.removeprefix("duckdb:")
        return self.db

    def replace(self, **changes: Any) -> Config:
        """A copy with some fields changed (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(Config)}


def _coerce(key: str, value: Any, source: str) -> Any:
    kind = _field_types()[key]
    if key == "scrape":
        return scrape_targets(value, source)
    try:
        if kind.startswith("dict"):
            if isinstance(value, Mapping):
                return {str(k): str(v) for k, v in value.items()}
            # env form: "tok1=tenantA,tok2=tenantB"
            return dict(item.split("=", 1) for item in str(value).split(",") if item)
        if isinstance(value, str) and value == "" and "None" in kind:
            return None
        if kind.startswith("bool"):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {key} = {value!r} is not a valid {kind}") from None


def _check_keys(data: Mapping[str, Any], source: str) -> None:
    known = _field_types()
    for key in data:
        if key not in known:
            hint = difflib.get_close_matches(key, list(known), n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"{source}: unknown setting {key!r}{suggestion}")


def _config_file(env: Mapping[str, str]) -> Path | None:
    explicit = env.get("SRE_AGENT_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"SRE_AGENT_CONFIG points at {path}, which is not a file")
        return path
    for candidate in (Path("sre-agent.toml"), Path.home() / ".config" / "sre-agent" / "config.toml"):
        if candidate.is_file():
            return candidate
    return None


def load_config(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    file: Path | None = None,
) -> Config:
    """Build a :class:`Config` from flags, environment and TOML file.

    Args:
        flags: values given on the command line; ``None`` values mean
            "not given" and do not override lower layers.
        env: the environment (defaults to ``os.environ``).
        file: an explicit TOML file (defaults to the search described above).
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    path = file if file is not None else _config_file(env)
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        _check_keys(data, str(path))
        values.update({k: _coerce(k, v, str(path)) for k, v in data.items()})
    known = _field_types()
    for name, raw in env.items():
        if name.startswith("SRE_AGENT_") and name != "SRE_AGENT_CONFIG":
            key = name[len("SRE_AGENT_") :].lower()
            if key not in known:
                _check_keys({key: raw}, f"environment variable {name}")
            values[key] = _coerce(key, raw, f"environment variable {name}")
    if flags:
        given = {k: v for k, v in flags.items() if v is not None}
        _check_keys(given, "command line")
        values.update(given)
    return Config(**values)
