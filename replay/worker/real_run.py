"""A whole replay into a real vLLM worker, as `vllm-contract replay --worker vllm` runs it.

Before any engine starts, the plan is checked (plan.py) and the shadow worker runs over the
same steps: a step at which it says vLLM's worker would raise is not run unless the caller
allows crashes. With `allow_crash`, the replay runs in a child process (spawned, so it holds no
state of ours but the trace's path), which reports each step over a pipe as JSON: an exception
comes back with its traceback, and a child that dies (a segfault) is reported with the step it
was running; this process stays usable either way.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from vllm_contract.errors import TraceError
from vllm_contract.findings import Finding, by_step
from vllm_contract.kinds import CRASHES, KINDS
from vllm_contract.replay.worker.plan import Plan, pick_engine, plan
from vllm_contract.replay.worker.real import Divergence
from vllm_contract.replay.worker.shadow import ShadowWorker

Progress = Callable[[int, int], None]


@dataclass
class RealResult:
    engine: str
    steps_replayed: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # would-crash and crash findings
    not_comparable: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    crash: dict | None = None  # {"step", "error", "traceback"}
    warmed: dict[str, int] = field(default_factory=dict)  # req_id -> prefix tokens prefilled

    def absorb(self, warmed: dict[str, int], not_comparable: dict[str, str]) -> None:
        """What the worker learnt while stepping: requests warmed up, or not comparable."""
        self.warmed.update(warmed)
        for rid, why in not_comparable.items():
            self.not_comparable.setdefault(rid, why)
        note = warm_note(self.warmed)
        self.notes = [n for n in self.notes if not n.startswith(WARM_NOTE)] + (
            [note] if note else [])

    def all_findings(self) -> list[Finding]:
        out = [d.finding(self.engine) for d in self.divergences] + self.findings
        return sorted(out, key=by_step)

    def to_dict(self) -> dict:
        found = [f.to_dict() for f in self.all_findings()]
        return {"worker": "vllm", "engine": self.engine, "steps_replayed": self.steps_replayed,
                "first": found[0] if found else None, "findings": found,
                "divergences": [d.to_dict() for d in self.divergences],
                "not_comparable": self.not_comparable, "warmed": self.warmed,
                "notes": self.notes, "crash": self.crash}


WARM_NOTE = "prefix-cache hits the replay never computed"


def warm_note(warmed: dict[str, int]) -> str | None:
    if not warmed:
        return None
    return (f"{WARM_NOTE}: {len(warmed)} request(s) began from prefix-cached blocks computed "
            f"before the replay's first step ({sum(warmed.values())} tokens in all; the "
            "recording began on a running engine, or --from is past the step that computed "
            "them): each prefix was prefilled into its blocks first, so those requests are "
            "compared as usual")


def crash_steps(engine, steps: list[int]) -> dict[int, Finding]:
    """The first shadow finding at which vLLM's worker would raise, per step."""
    w = ShadowWorker(engine)
    w.run(until=None)
    wanted = set(steps)
    out: dict[int, Finding] = {}
    for f in w.findings:
        if f.invariant in CRASHES and f.step in wanted and f.step not in out:
            out[f.step] = f
    return out


def prepare(trace, engine: str | None, model: str | None, start: int | None,
            until: int | None) -> Plan:
    return plan(pick_engine(trace, engine), model, start, until)


def _would_crash(f: Finding) -> Finding:
    return KINDS["replay.would_crash"].finding(
        f.step, f.req_id, f"not run: the shadow worker says the real worker raises here "
        f"({f.invariant}: {f.message}); --allow-crash runs it in a child process", f.engine)


def _crashed(engine: str, step: int | None, error: str) -> Finding:
    return KINDS["replay.crash"].finding(step, None, f"the real worker failed: {error}",
                                         engine)


def _start(p: Plan, force: bool, llm: Any = None):
    from vllm_contract.replay.worker.real import RealWorker

    try:
        return RealWorker(p, llm=llm, force=force)
    except TraceError:
        raise
    except Exception as e:  # vLLM refusing the manifest's settings: the input is unusable
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TraceError(f"could not start a vLLM engine for the trace: {line}") from e


def run_here(p: Plan, force: bool = False, allow_crash: bool = False,
             stop_at_first: bool = False, progress: Progress | None = None,
             llm: Any = None, crashes: dict[int, Finding] | None = None) -> RealResult:
    """The replay in this process; a Python exception in the worker ends it as a finding."""
    res = RealResult(p.engine.name, not_comparable=dict(p.not_comparable), notes=list(p.notes))
    crashes = crash_steps(p.engine, p.steps) if crashes is None else crashes
    w = _start(p, force, llm)
    total = len(p.steps)
    while not w.done:
        step = w.steps[w.pos]
        if step in crashes and not allow_crash:
            res.findings.append(_would_crash(crashes[step]))
            break
        try:
            found = w.step()
        except Exception as e:
            res.crash = {"step": step, "error": f"{type(e).__name__}: {e}",
                         "traceback": traceback.format_exc()}
            res.findings.append(_crashed(res.engine, step, res.crash["error"]))
            break
        res.divergences.extend(found)
        res.steps_replayed = w.pos
        if progress is not None:
            progress(w.pos, total)
        if stop_at_first and found:
            break
    res.absorb(w.warmed, w.not_comparable)
    return res


def _news(d: dict, seen: int) -> dict:
    """The entries of an insertion-ordered dict past the first `seen`."""
    return dict(list(d.items())[seen:]) if len(d) > seen else {}


def _child(conn, root: str, engine: str, model, start, until, force, stop_at_first) -> None:
    from vllm_contract.trace import open_trace

    def send(kind: str, **kw) -> None:
        conn.send_bytes(json.dumps({"kind": kind, **kw}).encode())

    try:
        w = _start(prepare(open_trace(root), engine, model, start, until), force)
        send("ready")
        while not w.done:
            send("begin", step=w.steps[w.pos])
            warmed, nc = len(w.warmed), len(w.not_comparable)
            found = w.step()
            send("step", pos=w.pos, divergences=[d.to_dict() for d in found],
                 warmed=_news(w.warmed, warmed), not_comparable=_news(w.not_comparable, nc))
            if stop_at_first and found:
                break
    except BaseException as e:
        send("error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    send("done")
    conn.close()


def run_in_child(p: Plan, root: str, model: str | None, start: int | None, until: int | None,
                 force: bool = False, stop_at_first: bool = False,
                 progress: Progress | None = None) -> RealResult:
    import multiprocessing as mp

    res = RealResult(p.engine.name, not_comparable=dict(p.not_comparable), notes=list(p.notes))
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(theirs, root, p.engine.name, model, start, until,
                                            force, stop_at_first), daemon=True)
    proc.start()
    theirs.close()
    running, total = None, len(p.steps)
    try:
        while True:
            try:
                msg = json.loads(mine.recv_bytes())
            except EOFError:
                proc.join(30)
                code = proc.exitcode
                error = (f"the worker process died (exit code {code})" if code is None or code >= 0
                         else f"the worker process died of signal {-code}")
                res.crash = {"step": running, "error": error, "traceback": None}
                res.findings.append(_crashed(res.engine, running, error))
                break
            kind = msg["kind"]
            if kind == "begin":
                running = msg["step"]
            elif kind == "step":
                res.steps_replayed = msg["pos"]
                res.divergences.extend(Divergence(**d) for d in msg["divergences"])
                res.absorb(msg["warmed"], msg["not_comparable"])
                if progress is not None:
                    progress(msg["pos"], total)
            elif kind == "error":
                if running is None and "TraceError" in msg["error"]:
                    raise TraceError(msg["error"].split(": ", 1)[-1])
                res.crash = {"step": running, "error": msg["error"],
                             "traceback": msg["traceback"]}
                res.findings.append(_crashed(res.engine, running, msg["error"]))
            elif kind == "done":
                break
    finally:
        mine.close()
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    return res


class RealSession:
    """A real worker stepped at will (what Session(worker="vllm") drives): divergences and
    findings so far, crash steps refused unless allowed, a worker that raised kept from
    stepping on until it goes back."""

    def __init__(self, trace, engine: str | None, model: str | None, force: bool,
                 allow_crash: bool, llm: Any = None) -> None:
        p = prepare(trace, engine, model, None, None)
        self.engine = p.engine.name
        self.allow_crash = allow_crash
        self.crashes = crash_steps(p.engine, p.steps)
        self.w = _start(p, force, llm)
        self.findings: list[Finding] = []
        self._notes = list(p.notes)
        self.broken: int | None = None  # the step at which the worker raised

    @property
    def not_comparable(self) -> dict[str, str]:
        return self.w.not_comparable

    @property
    def notes(self) -> list[str]:
        note = warm_note(self.w.warmed)
        return self._notes + ([note] if note else [])

    @property
    def steps(self) -> list[int]:
        return self.w.steps

    @property
    def position(self) -> int:
        return self.w.pos

    @property
    def done(self) -> bool:
        return self.w.done

    @property
    def divergences(self) -> list[Divergence]:
        return self.w.divergences

    def step(self) -> list:
        if self.w.done:
            return []
        if self.broken is not None:
            raise TraceError(f"the worker raised at step {self.broken}: go back to re-run "
                             "from the start")
        step = self.w.steps[self.w.pos]
        if step in self.crashes and not self.allow_crash:
            f = self.crashes[step]
            raise TraceError(f"step {step}: the shadow worker says vLLM's worker raises here "
                             f"({f.invariant}, req {f.req_id}); not run")
        try:
            return list(self.w.step())
        except Exception as e:
            self.broken = step
            f = _crashed(self.engine, step, f"{type(e).__name__}: {e}")
            self.findings.append(f)
            return [f]

    def goto(self, n: int, progress: Progress | None = None, cancel=None) -> bool:
        if n < self.w.pos or self.broken is not None:
            self.w.reset()
            self.broken = None
            self.findings = [f for f in self.findings if f.invariant != "replay.crash"]
        total = n
        while self.w.pos < n:
            if cancel is not None and cancel():
                return False
            self.step()
            if self.broken is not None:
                return True
            if progress is not None:
                progress(self.w.pos, total)
        return True

    def state(self) -> dict:
        return self.w.state()
