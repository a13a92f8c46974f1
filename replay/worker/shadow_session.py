"""The shadow worker behind the Worker interface (base.py): end-of-trace findings once the last
step is applied, checkpoints for going back, the trace's notes."""

from __future__ import annotations

from typing import Callable

from vllm_contract.findings import Finding
from vllm_contract.manifest import mid_stream_note
from vllm_contract.replay.worker.base import Progress
from vllm_contract.replay.worker.shadow import ShadowWorker


class ShadowSession:
    def __init__(self, engine, strict_order: bool = False, checkpoint_every: int = 256) -> None:
        self.engine = engine.name
        self.w = ShadowWorker(engine, strict_order=strict_order,
                              checkpoint_every=checkpoint_every)
        note = mid_stream_note(engine.manifest)
        self._notes = [note] if note else []

    @property
    def steps(self) -> list[int]:
        return self.w.steps

    @property
    def position(self) -> int:
        return self.w.s.pos

    @property
    def findings(self) -> list[Finding]:
        return list(self.w.findings)

    @property
    def divergences(self) -> list:
        return []

    @property
    def notes(self) -> list[str]:
        return list(self._notes)

    def step(self) -> list:
        if self.w.done:
            return []
        found = self.w.step()
        return found + (self.w.finish() if self.w.done else [])

    def goto(self, n: int, progress: Progress | None = None,
             cancel: Callable[[], bool] | None = None) -> bool:
        if n < self.position or self.w.finished:
            self.w.goto(n)
        ok = self.w.run(until=n, progress=progress, cancel=cancel)
        if ok and self.w.done:
            self.w.finish()
        return ok

    def state(self) -> dict:
        return self.w.state()
