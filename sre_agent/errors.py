"""One exception tree for sre-agent.

Every error a user can cause (bad input, a locked database, an unreachable
server, an empty comparison window) is an :class:`SreAgentError`. The CLI
renders these once, on stderr, without a traceback; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class SreAgentError(Exception):
    """Base class of every error sre-agent raises on purpose."""


class ConfigError(SreAgentError):
    """A configuration value, flag or file is invalid."""


class UsageError(ConfigError):
    """The command line is malformed (CLI exit code 2)."""


class StoreError(SreAgentError):
    """The DuckDB store cannot be opened, read or written."""


class StoreLockedError(StoreError):
    """Another process holds the database file for writing."""


class IngestError(SreAgentError):
    """Telemetry could not be decoded or accepted."""


class PayloadTooLargeError(IngestError):
    """A request body exceeds the size cap after decompression."""


class BadPayloadError(IngestError):
    """A request body is malformed (bad protobuf, bad JSON, bad encoding)."""


class OverloadedError(IngestError):
    """The receiver's queue is full; the client should retry later.

    Attributes:
        retry_after_s: the delay, in seconds, the client should wait.
    """

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SelectionError(SreAgentError):
    """A baseline/candidate selection is invalid or selects no data."""


class InsufficientDataError(SelectionError):
    """A window holds too few requests for the requested statistic."""


class EmptySelectionError(SelectionError):
    """A ``--service`` or ``--where`` filter matches nothing: the error names the filter.

    Distinct from other selection errors so callers can tell "nothing to
    evaluate" apart: ``diagnose`` exits 2 (usage), the canary answers
    "could not evaluate".
    """


class RemoteError(SreAgentError):
    """The sre-agent HTTP API could not be reached or answered an error.

    Attributes:
        status: the HTTP status of an error answer; ``None`` when no answer came.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PolicyError(SreAgentError):
    """The policy engine was misconfigured or a budget was exceeded."""


class ScenarioError(SreAgentError):
    """A scenario file is invalid."""


class CannotEvaluateError(SreAgentError):
    """The canary gate cannot judge at all: an unknown version or service (canary exit code 4)."""
