"""``python -m sre_agent`` runs the CLI."""

from __future__ import annotations

from sre_agent.cli import run

run()
