"""The Textual incident console; installed as ``sre_agent.tui``."""
