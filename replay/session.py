"""Stepping over a trace with a worker: what the TUI and `vllm-contract replay` use.

`Session(trace, worker="shadow")` steps the shadow worker (replay/worker/shadow/) over one
engine of a trace. Going back (or far ahead) restores the nearest checkpoint at or below the
target (one every `checkpoint_every` steps, a packed snapshot of the whole state) and replays
forward from it: at most `checkpoint_every - 1` steps of pure-Python work.

`Session(trace, worker="vllm")` builds a vLLM engine from the trace's manifest and feeds it the
recorded steps (replay/worker/real.py); `divergences` lists where its sampled tokens differ from
the recorded ones. vLLM's worker state cannot be checkpointed, so going back re-runs from the
start: one empty step frees every request the worker holds (no engine restart), then the steps
up to the target run again; going back to position n costs n real steps. A step at which the
shadow worker says vLLM's worker would raise is refused (TraceError) unless `allow_crash`; a
worker that raises is reported as a `replay.crash` finding and the session then only goes back.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.findings import Finding
from vllm_contract.replay.worker.base import Worker
from vllm_contract.replay.worker.shadow_session import ShadowSession
from vllm_contract.trace import Trace, open_trace

Progress = Callable[[int, int], None]
Cancel = threading.Event | Callable[[], bool] | None


def _cancelled(cancel: Cancel) -> Callable[[], bool] | None:
    if cancel is None:
        return None
    if isinstance(cancel, threading.Event):
        return cancel.is_set
    return cancel


class Session:
    """A worker stepped over one engine's recorded SchedulerOutputs.

    `position` is the number of steps applied (0: none); `step()` applies the next one,
    `back()` undoes the last, `goto(n)` reaches position n. `findings` are the worker's so far
    (those only the trace's end tells come once the last step is applied); `divergences` are a
    real worker's departures from the recorded outputs (always empty for the shadow). The
    worker is any Worker (replay/worker/base.py); this class knows none of their insides."""

    def __init__(self, trace: Trace | str | Path, worker: str = "shadow",
                 engine: str | None = None, strict_order: bool = False,
                 checkpoint_every: int = 256, model: str | None = None,
                 force_recorded_tokens: bool = False, allow_crash: bool = False,
                 llm=None) -> None:
        if worker not in WORKERS:
            raise TraceError(f"unknown worker {worker!r}: 'shadow' or 'vllm'")
        self.trace = trace if isinstance(trace, Trace) else open_trace(trace)
        self.kind = worker
        self.worker: Worker = WORKERS[worker](
            self.trace, engine, strict_order=strict_order, checkpoint_every=checkpoint_every,
            model=model, force_recorded_tokens=force_recorded_tokens, allow_crash=allow_crash,
            llm=llm)
        self.engine = self.worker.engine

    @property
    def steps(self) -> list[int]:
        """The engine's recorded step numbers, in order."""
        return self.worker.steps

    @property
    def position(self) -> int:
        return self.worker.position

    @property
    def findings(self) -> list[Finding]:
        return list(self.worker.findings)

    @property
    def divergences(self) -> list:
        """A real worker's token divergences so far (Divergence: step, req_id, recorded,
        replayed); always empty for the shadow worker."""
        return list(self.worker.divergences)

    @property
    def notes(self) -> list[str]:
        """What the replay cannot compare or reproduce: a trace begun mid-stream; for a real
        worker, requests not compared and warm-ups."""
        return list(self.worker.notes)

    def step(self) -> list:
        """Apply the next step; its findings (and, after the last, the end-of-trace ones), or
        with a real worker its divergences and crash findings."""
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


def _shadow(trace: Trace, engine: str | None, strict_order: bool = False,
            checkpoint_every: int = 256, **_real_only) -> Worker:
    engines = {e.name: e for e in trace.engines}
    name = trace.engines[0].name if engine is None else schema.plain_engine(engine)
    if name not in engines:
        raise TraceError(f"no engine {name!r} in the trace (it has {', '.join(engines)})")
    return ShadowSession(engines[name], strict_order=strict_order,
                         checkpoint_every=checkpoint_every)


def _real(trace: Trace, engine: str | None, model: str | None = None,
          force_recorded_tokens: bool = False, allow_crash: bool = False, llm=None,
          **_shadow_only) -> Worker:
    from vllm_contract.replay.worker.real_run import RealSession

    return RealSession(trace, engine, model, force_recorded_tokens, allow_crash, llm)


# worker name -> how to build it for an engine of a trace
WORKERS: dict[str, Callable[..., Worker]] = {"shadow": _shadow, "vllm": _real}
