"""Analysis: from a store's spans and metric points to a diagnosis, an exploration, a report.

Owns the comparison of two populations (``compare``, ``resolve``, ``selection``), what it
hands the rules (``metric_view``, ``busy``, ``other_spans``, ``decompose``, ``localise``),
the statistics (``stats``, ``exceedance``), what regressed (``headline``), the diagnosis and
its report, the console's queries (``explore``, ``explore_slices``) and the rule interface
(``rules_api``, ``rules_registry``).
May import ``sre_agent.store`` (the SQL text of the stored layout, the engines) and
``sre_agent.errors``/``config``; never ``api``, ``ingest``, ``canary`` or Textual.
"""
