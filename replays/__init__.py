"""Engine simulator, workload replay and scenario files; installed as ``sre_agent.replays``."""
