"""A whole replay, as `vllm-contract replay` runs it with any worker: each engine the worker kind
covers stepped up to --until, its findings from --from on, or only up to the first one."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from vllm_contract.findings import Finding, by_step
from vllm_contract.replay.session import Session
from vllm_contract.replay.worker.base import Divergence, Progress, WorkerOptions
from vllm_contract.replay.worker.registry import worker_class
from vllm_contract.trace import Trace, open_trace


@dataclass
class ReplayRun:
    """A replay's result, whichever the worker. `compares_tokens` (the worker class's) says
    whether the token comparison's fields mean anything; `planned` is the steps it meant to
    run, of which `steps_replayed` ran."""
    worker: str
    title: str  # the worker class's
    compares_tokens: bool = False
    engine: str | None = None  # the engine, when one was replayed
    steps_replayed: int = 0  # over all engines
    planned: int = 0
    findings: list[Finding] = field(default_factory=list)  # by step, engine, request
    divergences: list[Divergence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # each said once, whichever engine said it
    not_comparable: dict[str, str] = field(default_factory=dict)
    warmed: dict[str, int] = field(default_factory=dict)  # req_id -> prefix tokens prefilled
    crash: dict | None = None  # {"step", "error", "traceback"}

    def all_findings(self) -> list[Finding]:
        """The findings and the divergences as findings, by step."""
        return sorted(self.findings + [d.finding(self.engine) for d in self.divergences],
                      key=by_step)

    def to_dict(self) -> dict:
        found = [f.to_dict() for f in self.all_findings()]
        if not self.compares_tokens:
            return {"worker": self.worker, "steps_replayed": self.steps_replayed,
                    "first": found[0] if found else None, "findings": found,
                    "divergences": [], "notes": self.notes}
        return {"worker": self.worker, "engine": self.engine,
                "steps_replayed": self.steps_replayed,
                "first": found[0] if found else None, "findings": found,
                "divergences": [d.to_dict() for d in self.divergences],
                "not_comparable": self.not_comparable, "warmed": self.warmed,
                "notes": self.notes, "crash": self.crash}


def replay_range(trace: Trace | str | Path, worker: str = "shadow", engine: str | None = None,
                 start: int | None = None, until: int | None = None,
                 stop_at_first: bool = False, progress: Progress | None = None,
                 options: WorkerOptions | None = None) -> ReplayRun:
    """Step every engine the worker covers (or `engine`) through the steps up to `until`; the
    findings are those at steps from `start` to `until`. A worker that can skip steps (a real
    one must) starts at `start`; one that cannot applies the steps before it all the same,
    since the state at `start` needs them. With `stop_at_first`, stepping ends at the first
    step that finds something in that range and only its first finding is kept (a token
    worker keeps that step's divergences). `progress` is told of the steps as they go."""
    t = trace if isinstance(trace, Trace) else open_trace(trace)
    cls = worker_class(worker)
    opts = replace(options or WorkerOptions(), start=start, until=until)
    names = cls.engines(t, engine)
    lo = start if start is not None else -(2**63)
    hi = until if until is not None else 2**63 - 1
    run = ReplayRun(worker, cls.title, cls.compares_tokens,
                    names[0] if len(names) == 1 else None)
    sessions = []
    try:
        for name in names:
            s = Session(t, worker=worker, engine=name, options=opts)
            sessions.append(s)
            end = sum(1 for st in s.steps if st <= hi)
            run.planned += end
            if not stop_at_first:
                s.goto(end, progress=progress)
            else:
                while s.position < end and not s.worker.stopped:
                    r = s.step()
                    if progress is not None and r.applied:
                        progress(s.position, end)
                    if r.divergences or any(lo <= f.step <= hi for f in r.findings
                                            if f.step is not None):
                        break
                    if not r.applied:
                        break
            w = s.worker
            run.steps_replayed += s.position
            run.findings.extend(f for f in w.findings if f.step is not None and lo <= f.step <= hi)
            run.divergences.extend(w.divergences)
            run.not_comparable.update(w.not_comparable)
            run.warmed.update(w.warmed)
            run.crash = run.crash or w.crash
            if stop_at_first and (run.findings or run.divergences):
                break
    finally:
        for s in sessions:
            s.close()
    run.findings.sort(key=by_step)
    if stop_at_first:
        run.findings = run.findings[:1]
    run.notes = list(dict.fromkeys(n for s in sessions for n in s.notes))
    return run
