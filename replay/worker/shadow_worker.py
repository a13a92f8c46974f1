"""The shadow worker behind the Worker interface (base.py): the pure-Python model of vLLM's
worker state (shadow/), with checkpoints for going back, end-of-trace findings once the last
step is applied, and the trace's notes."""

from __future__ import annotations

from vllm_contract.findings import Finding
from vllm_contract.manifest import mid_stream_note
from vllm_contract.replay.worker.base import Cancel, Progress, Stepped, Worker, WorkerOptions
from vllm_contract.replay.worker.shadow import ShadowModel


class ShadowWorker(Worker):
    kind = "shadow"
    title = "the shadow worker"

    def __init__(self, engine, strict_order: bool = False, checkpoint_every: int = 256) -> None:
        self.engine = engine.name
        self.model = ShadowModel(engine, strict_order=strict_order,
                                 checkpoint_every=checkpoint_every)
        note = mid_stream_note(engine.manifest)
        self._notes = [note] if note else []

    @classmethod
    def open(cls, trace, engine: str | None, options: WorkerOptions) -> "ShadowWorker":
        name = cls.engines(trace, engine)[0]
        return cls(next(e for e in trace.engines if e.name == name),
                   strict_order=options.strict_order, checkpoint_every=options.checkpoint_every)

    @property
    def steps(self) -> list[int]:
        return self.model.steps

    @property
    def position(self) -> int:
        return self.model.s.pos

    @property
    def findings(self) -> list[Finding]:
        return list(self.model.findings)

    @property
    def notes(self) -> list[str]:
        return list(self._notes)

    def step(self) -> Stepped:
        m = self.model
        if m.done:
            return Stepped(applied=False)
        found = m.step()
        return Stepped(found + (m.finish() if m.done else []))

    def goto(self, n: int, progress: Progress | None = None, cancel: Cancel | None = None
             ) -> bool:
        m = self.model
        if n < self.position or m.finished:
            m.goto(n)
        ok = m.run(until=n, progress=progress, cancel=cancel)
        if ok and m.done:
            m.finish()
        return ok

    def state(self) -> dict:
        return self.model.state()
