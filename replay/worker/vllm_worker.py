"""A real vLLM worker behind the Worker interface (base.py), as `replay --worker vllm` and the TUI
step it: the driver (vllm_driver.py) in this process (VllmWorker), or, when crashes are allowed,
in a child process (VllmChildWorker). The child (spawned, so it holds no state of ours but the
trace's path) runs VllmWorker with crash steps allowed and answers each request over a pipe as
JSON: an exception in vLLM comes back with its traceback; a child that dies (a segfault) is
reported with the step it was running, and going back starts a new child. This process stays
usable either way.

Before any engine starts, the plan is checked (plan.py) and the shadow worker runs over the same
steps: a step at which it says vLLM's worker would raise is not run (a `replay.would_crash`
finding, and the worker stops there) unless crashes are allowed. A step that raises is a
`replay.crash` finding with its traceback, and the worker then only goes back.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import asdict, replace
from typing import Any

from vllm_contract.errors import TraceError
from vllm_contract.findings import Finding
from vllm_contract.kinds import CRASHES, KINDS
from vllm_contract.replay.worker.base import (Cancel, Divergence, Progress, Stepped, Worker,
                                              WorkerOptions)
from vllm_contract.replay.worker.plan import Plan, pick_engine, plan
from vllm_contract.replay.worker.shadow import ShadowModel

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
    w = ShadowModel(engine)
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


def would_crash(f: Finding) -> Finding:
    return KINDS["replay.would_crash"].finding(
        f.step, f.req_id, f"not run: the shadow worker says the real worker raises here "
        f"({f.invariant}: {f.message}); --allow-crash runs it in a child process", f.engine)


def crashed(engine: str, step: int | None, error: str) -> Finding:
    return KINDS["replay.crash"].finding(step, None, f"the real worker failed: {error}",
                                         engine)


def start_driver(p: Plan, force: bool, llm: Any = None):
    from vllm_contract.replay.worker.vllm_driver import VllmDriver

    try:
        return VllmDriver(p, llm=llm, force=force)
    except TraceError:
        raise
    except Exception as e:  # vLLM refusing the manifest's settings: the input is unusable
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TraceError(f"could not start a vLLM engine for the trace: {line}") from e


class VllmWorker(Worker):
    """The driver in this process: a Python exception in vLLM is a finding; a segfault is not
    survived (VllmChildWorker survives it)."""
    kind = "vllm"
    title = "a vLLM worker"
    compares_tokens = True
    rewinds_cheaply = False
    starting = "starting the vLLM worker: an engine built from the trace's manifest…"

    def __init__(self, p: Plan, force: bool = False, allow_crash: bool = False,
                 llm: Any = None) -> None:
        self.engine = p.engine.name
        self.allow_crash = allow_crash
        self.crashes = {} if allow_crash else crash_steps(p.engine, p.steps)
        self.w = start_driver(p, force, llm)
        self._findings: list[Finding] = []
        self._notes = list(p.notes)
        self._crash: dict | None = None
        self._stopped = False

    @classmethod
    def engines(cls, trace, engine: str | None) -> list[str]:
        return [pick_engine(trace, engine).name]

    @classmethod
    def precheck(cls, trace, engine: str | None, options: WorkerOptions) -> None:
        from vllm_contract.replay.worker.plan import model_path

        model_path(pick_engine(trace, engine), options.model)

    @classmethod
    def open(cls, trace, engine: str | None, options: WorkerOptions) -> Worker:
        p = prepare(trace, engine, options.model, options.start, options.until)
        if options.allow_crash:
            return VllmChildWorker(trace, p, options)
        return cls(p, options.force_recorded_tokens, False, options.llm)

    @property
    def steps(self) -> list[int]:
        return self.w.steps

    @property
    def position(self) -> int:
        return self.w.pos

    @property
    def findings(self) -> list[Finding]:
        return list(self._findings)

    @property
    def divergences(self) -> list[Divergence]:
        return list(self.w.divergences)

    @property
    def notes(self) -> list[str]:
        note = warm_note(self.w.warmed)
        return self._notes + ([note] if note else [])

    @property
    def not_comparable(self) -> dict[str, str]:
        return dict(self.w.not_comparable)

    @property
    def warmed(self) -> dict[str, int]:
        return dict(self.w.warmed)

    @property
    def crash(self) -> dict | None:
        return self._crash

    @property
    def stopped(self) -> bool:
        return self._stopped

    def step(self) -> Stepped:
        if self.w.done or self._stopped:
            return Stepped(applied=False)
        step = self.w.steps[self.w.pos]
        if step in self.crashes and not self.allow_crash:
            f = would_crash(self.crashes[step])
        else:
            try:
                return Stepped(divergences=list(self.w.step()))
            except Exception as e:
                self._crash = {"step": step, "error": f"{type(e).__name__}: {e}",
                               "traceback": traceback.format_exc()}
                f = crashed(self.engine, step, self._crash["error"])
        self._stopped = True
        self._findings.append(f)
        return Stepped([f], applied=False)

    def goto(self, n: int, progress: Progress | None = None, cancel: Cancel | None = None
             ) -> bool:
        # after a refusal the state is sound and going on stays refused; after a crash it is not
        if n < self.w.pos or self._crash is not None:
            self.w.reset()
            self._stopped, self._crash, self._findings = False, None, []
        while self.w.pos < n and not self._stopped:
            if cancel is not None and cancel():
                return False
            self.step()
            if progress is not None and not self._stopped:
                progress(self.w.pos, n)
        return True

    def state(self) -> dict:
        return self.w.state()


def _news(d: dict, seen: int) -> dict:
    """The entries of an insertion-ordered dict past the first `seen`."""
    return dict(list(d.items())[seen:]) if len(d) > seen else {}


def _serve(conn, root: str, engine: str, options: dict) -> None:
    from vllm_contract.trace import open_trace

    def send(kind: str, **kw) -> None:
        conn.send_bytes(json.dumps({"kind": kind, **kw}).encode())

    try:
        o = WorkerOptions(**options)
        p = prepare(open_trace(root), engine, o.model, o.start, o.until)
        w = VllmWorker(p, o.force_recorded_tokens, allow_crash=True)
    except BaseException as e:
        send("error", error=f"{type(e).__name__}: {e}", trace_error=isinstance(e, TraceError))
        conn.close()
        return
    send("ready")
    while True:
        try:
            ask = json.loads(conn.recv_bytes())
        except EOFError:
            break
        if ask["op"] == "step":
            warmed, nc = len(w.w.warmed), len(w.w.not_comparable)
            try:
                r = w.step()
            except BaseException as e:  # the worker's own failure is a finding already
                send("error", error=f"{type(e).__name__}: {e}",
                     traceback=traceback.format_exc())
                break
            send("step", pos=w.position, applied=r.applied,
                 findings=[asdict(f) for f in r.findings],
                 divergences=[d.to_dict() for d in r.divergences], crash=w.crash,
                 warmed=_news(w.w.warmed, warmed), not_comparable=_news(w.w.not_comparable, nc))
        elif ask["op"] == "reset":
            w.goto(0)
            send("reset")
        elif ask["op"] == "state":
            send("state", state=w.state())
        else:
            break
    conn.close()


class VllmChildWorker(VllmWorker):
    """VllmWorker's steps, each run in the child; what it learns kept here."""

    def __init__(self, trace, p: Plan, options: WorkerOptions) -> None:
        self.engine = p.engine.name
        self._root = str(trace.root)
        self._options = {k: v for k, v in asdict(replace(options, llm=None)).items()
                         if k != "llm"}
        self._steps = list(p.steps)
        self._plan_notes = list(p.notes)
        self._plan_nc = dict(p.not_comparable)
        self._proc = None
        self._spawn()

    def _spawn(self) -> None:
        import multiprocessing as mp

        self.close()
        ctx = mp.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(theirs, self._root, self.engine,
                                                      self._options), daemon=True)
        self._proc.start()
        theirs.close()
        self._pos = 0
        self._findings: list[Finding] = []
        self._divergences: list[Divergence] = []
        self._nc = dict(self._plan_nc)
        self._warmed: dict[str, int] = {}
        self._crash: dict | None = None
        self._stopped = False
        try:
            msg = self._recv()
        except EOFError:
            raise TraceError(f"the worker process died as it started ({self._died()})") from None
        if msg["kind"] == "error":
            self.close()
            raise TraceError(msg["error"].split(": ", 1)[-1] if msg.get("trace_error")
                             else f"the worker process could not start: {msg['error']}")

    def _recv(self) -> dict:
        return json.loads(self._conn.recv_bytes())

    def _died(self) -> str:
        self._proc.join(30)
        code = self._proc.exitcode
        return (f"exit code {code}" if code is None or code >= 0 else f"signal {-code}")

    def _ask(self, op: str) -> dict:
        self._conn.send_bytes(json.dumps({"op": op}).encode())
        return self._recv()

    @property
    def steps(self) -> list[int]:
        return self._steps

    @property
    def position(self) -> int:
        return self._pos

    @property
    def divergences(self) -> list[Divergence]:
        return list(self._divergences)

    @property
    def notes(self) -> list[str]:
        note = warm_note(self._warmed)
        return self._plan_notes + ([note] if note else [])

    @property
    def not_comparable(self) -> dict[str, str]:
        return dict(self._nc)

    @property
    def warmed(self) -> dict[str, int]:
        return dict(self._warmed)

    def _fail(self, step: int, error: str, tb: str | None) -> Stepped:
        self._crash = {"step": step, "error": error, "traceback": tb}
        f = crashed(self.engine, step, error)
        self._findings.append(f)
        self._stopped = True
        return Stepped([f], applied=False)

    def step(self) -> Stepped:
        if self._pos >= len(self._steps) or self._stopped:
            return Stepped(applied=False)
        step = self._steps[self._pos]
        try:
            msg = self._ask("step")
        except (EOFError, OSError, BrokenPipeError):
            return self._fail(step, f"the worker process died ({self._died()})", None)
        if msg["kind"] == "error":
            return self._fail(step, msg["error"], msg.get("traceback"))
        self._pos = msg["pos"]
        self._warmed.update(msg["warmed"])
        for rid, why in msg["not_comparable"].items():
            self._nc.setdefault(rid, why)
        r = Stepped([Finding(**f) for f in msg["findings"]],
                    [Divergence(**d) for d in msg["divergences"]], msg["applied"])
        self._findings += r.findings
        self._divergences += r.divergences
        if msg["crash"] is not None:
            self._crash, self._stopped = msg["crash"], True
        elif not r.applied:
            self._stopped = True
        return r

    def goto(self, n: int, progress: Progress | None = None, cancel: Cancel | None = None
             ) -> bool:
        if n < self._pos or self._crash is not None:
            try:
                self._ask("reset")
                self._pos, self._findings, self._divergences = 0, [], []
                self._nc, self._warmed = dict(self._plan_nc), {}
                self._crash, self._stopped = None, False
            except (EOFError, OSError):  # the child died with the crash: a new one
                self._spawn()
        while self._pos < n and not self._stopped:
            if cancel is not None and cancel():
                return False
            self.step()
            if progress is not None and not self._stopped:
                progress(self._pos, n)
        return True

    def state(self) -> dict:
        try:
            return self._ask("state")["state"]
        except (EOFError, OSError):
            return {"position": self._pos, "step": None, "held": {}, "tokens": {},
                    "divergences": []}

    def close(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is None:
            return
        try:
            self._conn.close()
        except OSError:
            pass
        proc.join(60)
        if proc.is_alive():
            proc.kill()
        self._proc = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
