"""Stepping over a trace with a worker: what the TUI, `replay` and `check --worker` use.

`Session(trace, worker=NAME)` opens the worker kind registered as NAME (replay/worker/registry.py)
over one engine of a trace and steps it: `step()`, `back()`, `goto(n)`. The kinds differ in what
going back costs, which their class says (`rewinds_cheaply`): the shadow worker restores the
nearest checkpoint at or below the target and replays forward from it; a real vLLM worker's state
cannot be checkpointed, so it frees every request it holds (one empty step, no engine restart)
and re-runs the steps up to the target. This class knows none of their insides.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from vllm_contract.findings import Finding
from vllm_contract.replay.worker.base import Divergence, Progress, Stepped, Worker, WorkerOptions
from vllm_contract.replay.worker.registry import worker_class
from vllm_contract.trace import Trace, open_trace

Cancel = threading.Event | Callable[[], bool] | None


def _cancelled(cancel: Cancel) -> Callable[[], bool] | None:
    if cancel is None:
        return None
    if isinstance(cancel, threading.Event):
        return cancel.is_set
    return cancel


class Session:
    """A worker stepped over one engine's recorded SchedulerOutputs.

    `position` is the number of steps applied (0: none); `findings` are the worker's so far
    (those only the trace's end tells come once the last step is applied); `divergences` are a
    token-comparing worker's departures from the recorded outputs. Settings go in `options`
    (a WorkerOptions) or as its fields by keyword."""

    def __init__(self, trace: Trace | str | Path, worker: str = "shadow",
                 engine: str | None = None, options: WorkerOptions | None = None,
                 **settings) -> None:
        self.trace = trace if isinstance(trace, Trace) else open_trace(trace)
        self.kind = worker
        cls = worker_class(worker)
        opts = options or WorkerOptions()
        if settings:
            from dataclasses import replace

            opts = replace(opts, **settings)
        self.worker: Worker = cls.open(self.trace, engine, opts)
        self.engine = self.worker.engine

    @property
    def steps(self) -> list[int]:
        """The engine's recorded step numbers this worker applies, in order."""
        return self.worker.steps

    @property
    def position(self) -> int:
        return self.worker.position

    @property
    def findings(self) -> list[Finding]:
        return self.worker.findings

    @property
    def divergences(self) -> list[Divergence]:
        """Token divergences so far (step, req_id, recorded, replayed); always empty for a
        worker that does not compare tokens."""
        return self.worker.divergences

    @property
    def notes(self) -> list[str]:
        """What the replay cannot compare or reproduce: a trace begun mid-stream; for a real
        worker, requests not compared and warm-ups."""
        return self.worker.notes

    def step(self) -> Stepped:
        """Apply the next step: what it found (see base.Stepped)."""
        return self.worker.step()

    def back(self) -> None:
        self.goto(self.position - 1)

    def goto(self, n: int, progress: Progress | None = None, cancel: Cancel = None) -> bool:
        """Reach position n (clamped to 0..len(steps)); False if cancelled on the way (the
        session then stands where it stopped)."""
        n = max(0, min(n, len(self.steps)))
        return self.worker.goto(n, progress, _cancelled(cancel))

    def run(self, progress: Progress | None = None, cancel: Cancel = None) -> bool:
        """To the end; False if cancelled."""
        return self.goto(len(self.steps), progress, cancel)

    def state(self) -> dict:
        """The worker's state at this position, as plain data (JSON-ready)."""
        return self.worker.state()

    def close(self) -> None:
        self.worker.close()
