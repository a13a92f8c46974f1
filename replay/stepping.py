"""A whole replay into the shadow worker, as `vllm-contract replay` runs it: each engine of a
trace stepped up to --until, its findings from --from on, or only the first one."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from vllm_contract.findings import Finding, by_step
from vllm_contract.replay.session import Session
from vllm_contract.trace import Trace, open_trace

Progress = Callable[[int, int], None]


@dataclass
class ReplayRun:
    worker: str
    steps_replayed: int = 0  # over all engines
    findings: list[Finding] = field(default_factory=list)  # by step, engine, request
    notes: list[str] = field(default_factory=list)  # each said once, whichever engine said it

    def to_dict(self) -> dict:
        rows = [f.to_dict() for f in self.findings]
        # the keys of the real replay's result (real_run.RealResult) that a shadow has
        return {"worker": self.worker, "steps_replayed": self.steps_replayed,
                "first": rows[0] if rows else None, "findings": rows,
                "divergences": [], "notes": self.notes}


def replay_range(trace: Trace | str | Path, worker: str = "shadow", engine: str | None = None,
                 start: int | None = None, until: int | None = None,
                 stop_at_first: bool = False, progress: Progress | None = None) -> ReplayRun:
    """Step every engine (or `engine`) through the steps up to `until`; the findings are
    those at steps from `start` to `until` (the steps before `start` are applied all the
    same, since the state at `start` needs them). With `stop_at_first`, stepping ends at the
    first step that finds something in that range and only the first finding is kept.
    `progress` is told of the steps of an engine replayed whole."""
    t = trace if isinstance(trace, Trace) else open_trace(trace)
    names = [e.name for e in t.engines] if engine is None else [engine]
    sessions = [Session(t, worker=worker, engine=n) for n in names]
    lo = start if start is not None else -(2**63)
    hi = until if until is not None else 2**63 - 1
    run = ReplayRun(worker)
    stop = threading.Event()
    for s in sessions:
        end = sum(1 for st in s.steps if st <= hi)
        if not stop_at_first:
            s.goto(end, progress=progress)
        else:
            while s.position < end and not stop.is_set():
                if any(lo <= f.step <= hi for f in s.step() if f.step is not None):
                    stop.set()
        run.steps_replayed += s.position
        run.findings.extend(f for f in s.findings if f.step is not None and lo <= f.step <= hi)
        if stop.is_set():
            break
    run.findings.sort(key=by_step)
    if stop_at_first:
        run.findings = run.findings[:1]
    run.notes = list(dict.fromkeys(n for s in sessions for n in s.notes))
    return run
