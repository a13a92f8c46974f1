"""One recorded scheduler checked, and the rule for what a test's own driving produces
(docs/pytest-plugin.md, "Tests are not engines"). A test may call schedule() twice without an
update, never update after its last step, or hand update_from_output() a ModelRunnerOutput for
a request that step did not schedule: things an engine never does. The findings that only such
driving can cause, those of the invariants in DRIVEN at a step the test drove so (or the step
after it), are notes, each saying why; every other finding stands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# the invariants that read the update side (what the model returned, and what the scheduler
# did with it): a step without an update, or with an output no engine would hand over, breaks
# them without any fault of the scheduler's
DRIVEN = ("outputs.", "progress.", "computed.progress", "lifecycle.abandoned",
          "tokens.total_mismatch")


def _driven(invariant: str) -> bool:
    return any(invariant == d or (d.endswith(".") and invariant.startswith(d)) for d in DRIVEN)


def irregular(engine: Any) -> tuple[dict[int, str], list[str]]:
    """The steps a test drove as no engine does (step -> why), and a note on each kind."""
    steps = engine.read("steps", ["step"])["step"].to_pylist()
    updated = set(engine.read("updates", ["step"])["step"].to_pylist())
    out: dict[int, str] = {}
    notes = []
    missing = [s for s in steps if s not in updated]
    if missing:
        last = missing[-1] == steps[-1]
        notes.append(f"{len(missing)} step(s) without update_from_output() (the first at step "
                     f"{missing[0]}" + ("; the last step: the test stopped there" if last
                                        else "") + "): no engine schedules without updating")
        for s in missing:
            out[s] = "no update_from_output() after this schedule()"
    sched = engine.read("scheduled", ["step", "req_id", "num_scheduled_tokens"]).to_pylist()
    listed = {(r["step"], r["req_id"]) for r in sched if r["num_scheduled_tokens"]}
    foreign = sorted({(r["step"], r["req_id"]) for r in
                      engine.read("model_outputs", ["step", "req_id"]).to_pylist()} - listed)
    if foreign:
        notes.append(f"{len(foreign)} model output(s) for a request its step did not schedule "
                     f"(the first: {foreign[0][1]} at step {foreign[0][0]}): a hand-built "
                     "ModelRunnerOutput, not a worker's")
        for s, rid in foreign:
            out.setdefault(s, f"a model output for {rid}, which the step did not schedule")
    return out, notes


def check(path: Path, shadow: bool) -> tuple[int, list[Any], list[Any], list[str]]:
    """(steps, findings at warning or above that stand, findings taken for the test's
    driving, notes) of the trace at `path`."""
    from vllm_contract.replay.resim.record import catalog_findings
    from vllm_contract.trace import open_trace

    t = open_trace(path)
    (engine,) = t.engines
    steps = len(engine.read("steps", ["step"]))
    found = list(catalog_findings(path))
    if shadow:
        from vllm_contract.findings import RANK
        from vllm_contract.replay.worker.shadow import run_shadow

        found += [f for f in run_shadow(t) if RANK[f.severity] >= RANK["warning"]]
    odd, notes = irregular(engine)
    stand, excused = [], []
    for f in found:
        why = None
        if _driven(f.invariant) and f.step is not None:
            why = odd.get(f.step) or odd.get(f.step - 1)
        if why is None:
            stand.append(f)
        else:
            excused.append(f)
            notes.append(f"{f.invariant} at step {f.step}"
                         + (f" ({f.req_id})" if f.req_id else "")
                         + f" taken for the test's driving ({why}), not counted")
    return steps, stand, excused, notes
