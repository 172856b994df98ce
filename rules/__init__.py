"""Diagnosis rules, one module each; installed as ``sre_agent.rules``."""
