"""HTTP API: the server (``serve``, ``serve --read``), its routes, auth and the remote client.

Owns the Starlette application, tenant tokens, the routes for diagnose, explore and the
Argo Rollouts / Flagger canary calls, and the client the console uses against them.
May import every other part (it is the top floor below the CLI); nothing in
``analysis``, ``canary`` or ``store`` imports it.
"""
