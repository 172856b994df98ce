"""Canary verdicts: the spec, the gathering of both sides, the sequential test.

Owns what a canary check decides (``verdict``) from a spec (``spec``), the per-side data it
gathers from a store (``gather``, ``sides``) and its sequential test (``sequential``); the
exceedance test it shares with the diagnosis is ``analysis.exceedance``. May import
``analysis`` and ``store``; the HTTP routes live in ``api``.
"""
