"""The demo's recording, for the TUI's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_trace(cpu_llm, tmp_path_factory) -> Path:
    """The demo's workload on a real CPU engine, recorded (chunked prefill, preemption, aborts)."""
    from vllm_contract.recorder import attach
    from vllm_contract.rig.engine import demo_workload, scheduler_of

    out = tmp_path_factory.mktemp("demo") / "trace"
    with attach(scheduler_of(cpu_llm), out):
        demo_workload(cpu_llm)
    return out
