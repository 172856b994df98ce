"""Fixtures for the diagnose tests: small stores built from serving mechanics (see ``synth``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import Options, Side, build_store

#: Short windows keep each store at a few thousand requests per side (a few seconds to build).
DURATION_S = 300.0


def _side(**kw: object) -> Side:
    return Side(duration_s=DURATION_S, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    """name -> (store path, deploy time ns); built once per session, lazily per name."""
    return {}


@pytest.fixture(scope="session")
def make_store(tmp_path_factory: pytest.TempPathFactory, stores: dict[str, tuple[Path, int]]):  # type: ignore[no-untyped-def]
    """Build (once) the named mechanism case and return (path, deploy_ns)."""
    root = tmp_path_factory.mktemp("diagnose")
    cases: dict[str, tuple[Side, Side, Options]] = {
        "none": (_side(), _side(version="v2"), Options()),
        "load": (_side(), _side(version="v2", rate_rps=28.0), Options()),
        "capacity": (_side(), _side(version="v2", replicas=3), Options()),
        "slow_host": (_side(), _side(version="v2", slow_hosts={"gpu-2": 3.0}), Options()),
        # A decisive shift (50/50 -> 10/90): the case is about attribution. At 20/80, TTFT p50 rose
        # 1.42x at z ~ 2.3 once the correlation of this store's queueing bursts is counted, below
        # the family-wise bar, and the headline became a stage.
        "mix": (
            _side(tenant_input_scale={"globex": 4.0}),
            _side(version="v2", tenants={"acme": 0.1, "globex": 0.9}, tenant_input_scale={"globex": 4.0}),
            Options(),
        ),
        "spans_only": (_side(), _side(version="v2", rate_rps=28.0), Options(metrics=False)),
        "metrics_only": (_side(), _side(version="v2", rate_rps=28.0), Options(engine_spans=False)),
        "skew": (_side(), _side(version="v2", rate_rps=28.0), Options(gateway_spans=True, clock_skew_s=3.0)),
        "malformed": (_side(malformed=40), _side(version="v2", malformed=40), Options()),
        "gateway": (_side(), _side(version="v2", slow_hosts={"gpu-1": 3.0}), Options(gateway_spans=True)),
    }

    def make(name: str) -> tuple[Path, int]:
        if name not in stores:
            baseline, candidate, opts = cases[name]
            path = root / f"{name}.duckdb"
            stores[name] = (path, build_store(path, baseline, candidate, opts))
        return stores[name]

    return make
