"""Helpers for the TUI's pilot tests: real traces, the real app, and a wait for what the app's
thread workers post back."""

from __future__ import annotations

import time
from pathlib import Path

from vllm_contract.trace import open_trace

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
SIZE = (150, 45)


async def until(pilot, cond, timeout: float = 20.0) -> None:
    """Let the app run until `cond()` holds (its workers are threads: results arrive later)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"the app did not get there in {timeout} s")
        await pilot.pause(0.02)


def ready(app) -> bool:
    """Steps listed, findings checked, the cursor's step read in full."""
    d = app.query_one("DetailPane").detail
    return (app.checked or not app.run_checks) and d is not None and d.step == app.steps.step


def table(trace: Path, name: str) -> list[dict]:
    """A trace table's rows as the reader (pyarrow) gives them: what the app must agree with."""
    return open_trace(trace).read(name).to_pylist()


def make_app(trace: Path, **kw):
    from vllm_contract.tui.app import ContractApp
    from vllm_contract.tui.data import TraceData

    return ContractApp(TraceData(trace), **kw)
