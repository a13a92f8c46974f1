"""The long suite's fixtures (`make reduce-all`): outside tests/, so that `make test` does not
collect it; the settings of tests/conftest.py that its runs depend on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CONTRACT_CACHE", str(Path(__file__).resolve().parents[1] / ".cache"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@pytest.fixture(scope="session")
def tiny_model() -> str:
    try:
        import vllm  # noqa: F401
    except Exception as e:  # a missing dependency fails loudly, never skips
        pytest.fail(f"these tests need the CPU build of vLLM: run `make setup`; import failed: "
                    f"{e}")
    from vllm_contract.rig import tiny_model as tm

    return str(tm.build())
