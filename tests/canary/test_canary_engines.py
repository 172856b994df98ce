"""The canary's store-backed cases on both engines: the same verdict from DuckDB and from the exporter's tables.

Each store of the verdict suite (a regressed version with findings, an unchanged one,
low traffic, vLLM's ITL histogram, SGLang-like spans without e2e and with malformed
TTFTs) is also laid out in the OTel Collector ClickHouse exporter's tables in chdb
(``exporter_layout.duckdb_to_exporter``) and evaluated there through
:mod:`sre_agent.store.clickhouse`; the verdicts must be the same, floats to 1e-9.
Opt-in: ``-m clickhouse``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from canary_synth import T0, Profile, spans_table, version_pair_store, write_store
from exporter_layout import differences, duckdb_to_exporter
from test_canary_verdict import VERSIONS, _itl_histograms

from sre_agent.analysis.selection import Selection
from sre_agent.canary.spec import CanarySpec
from sre_agent.canary.verdict import evaluate
from sre_agent.errors import CannotEvaluateError
from sre_agent.store.embedded import Store

pytestmark = pytest.mark.clickhouse


def _unchanged(path: Path) -> None:
    version_pair_store(path, n_baseline=5000, n_candidate=5000, seed=9)


def _low_traffic(path: Path) -> None:
    version_pair_store(path, n_baseline=2000, n_candidate=30, seed=2)


def _itl(path: Path) -> None:
    rng = np.random.default_rng(4)
    write_store(path, [spans_table(rng, 3000, "v1", Profile()), spans_table(rng, 3000, "v2", Profile())])
    with Store.open(path) as store:
        store.append_metric_points(_itl_histograms("v1", [0, 5000, 90000, 4000, 1000, 0, 0, 0], T0))
        store.append_metric_points(_itl_histograms("v2", [0, 1000, 40000, 20000, 20000, 19000, 0, 0], T0))


def _derived(path: Path) -> None:
    rng = np.random.default_rng(8)
    base, cand = spans_table(rng, 2000, "v1", Profile()), spans_table(rng, 2000, "v2", Profile())
    cand = cand.set_column(cand.schema.get_field_index("e2e_s"), "e2e_s", pa.nulls(cand.num_rows, pa.float64()))
    bad_ttft = np.array(cand.column("ttft_s").to_pylist())
    bad_ttft[::100] = -1.0
    cand = cand.set_column(cand.schema.get_field_index("ttft_s"), "ttft_s", pa.array(bad_ttft))
    write_store(path, [base, cand])


def _regressed(path: Path) -> None:
    version_pair_store(path, n_baseline=4000, n_candidate=4000, candidate=Profile(ttft_scale=2.0), seed=5)


CASES: dict[str, tuple[Callable[[Path], None], list[str], list[str], dict[str, Any]]] = {
    "regressed, with findings": (
        _regressed, ["ttft_p99=3s", "error_rate=1%", "goodput=0.9"], ["ttft_p99=15%"], {"findings_budget_s": 120.0}
    ),
    "unchanged": (_unchanged, ["ttft_p99=5s", "itl_p99=80ms", "error_rate=2%"], ["ttft_p50=15%"], {}),
    "low traffic": (_low_traffic, ["ttft_p99=30s", "error_rate=5%"], [], {}),
    "itl histogram": (_itl, ["itl_p99=80ms", "tpot_p99=80ms"], [], {}),
    "derived and malformed": (_derived, ["e2e_p99=60s", "ttft_p90=5s"], [], {"findings": 0}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_verdict_from_both_engines(case: str, tmp_path: Path) -> None:
    from sre_agent.store.clickhouse import connect_clickhouse

    build, slos, regressions, options = CASES[case]
    db, house = tmp_path / "store.duckdb", tmp_path / "otel-chdb"
    build(db)
    duckdb_to_exporter(db, house)
    spec = CanarySpec.from_strings(slos, regressions, **options)
    with Store.open(db, read_only=True) as store:
        expected = evaluate(store.connection, VERSIONS, spec)
    connection = connect_clickhouse(f"chdb:{house}")
    try:
        got = evaluate(connection, VERSIONS, spec)
        unknown = Selection(mode="versions", baseline_version="v1", candidate_version="v3")
        with pytest.raises(CannotEvaluateError, match=r"service.version='v3'.*versions present: v1, v2"):
            evaluate(connection, unknown, spec)
    finally:
        connection.close()
    assert got.verdict == expected.verdict
    assert differences(expected.to_dict(), got.to_dict()) == []
