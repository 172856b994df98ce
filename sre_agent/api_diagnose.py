"""Alias under the name ``sre-agent serve`` probes for optional route modules.

The diagnose routes live in :mod:`sre_agent.diagnose_api`; this module only
re-exports them so the server mounts ``POST /api/v1/diagnose`` whichever of
the two names it lists.
"""

from __future__ import annotations

from sre_agent.diagnose_api import routes

__all__ = ["routes"]
