"""The re-run: a fresh scheduler fed the recording's derived inputs in their recorded order,
each SchedulerOutput compared with the recorded one in canonical form (canonical.py)."""

from __future__ import annotations

import bdb
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from vllm_contract.errors import TraceError
from vllm_contract.plain import is_opaque
from vllm_contract.replay.resim import build as building
from vllm_contract.replay.resim import debug, log, record
from vllm_contract.replay.resim.inputs import DERIVED, Call, Inputs, derive
from vllm_contract.replay.resim.words import Difference, finish_difference, first_difference

# Prompts redacted: what the trace lacks is left out of both sides of the comparison.
_REDACTED_NEW = ("prompt_token_ids", "prefill_token_ids")


@dataclass(frozen=True)
class StepResult:
    step: int
    identical: bool
    difference: str | None  # "step 5: the recording scheduled p7 for 512 tokens; ..."
    request: str | None = None
    field: str | None = None


@dataclass
class Summary:
    engine: str
    scheduler_class: str
    steps: int = 0
    identical_steps: int = 0
    first: StepResult | None = None  # the first divergent step
    notes: list[str] = field(default_factory=list)
    recorded_steps: int = 0
    stopped: bool = False  # the re-run's scheduler raised: the steps after it were not run
    until: int | None = None  # the run was stopped after this step (--until)
    quit_at: int | None = None  # the debugger was quit at this step: it and later ones not run
    recorded: record.Recorded | None = None  # --out: the new trace and its catalog findings
    whatif: Any = None  # a what-if run: its whatif.Comparison with the recording

    @property
    def identical(self) -> bool:
        return self.first is None and self.steps > 0

    def as_dict(self) -> dict:
        f = self.first
        return {"engine": self.engine, "scheduler_class": self.scheduler_class,
                "steps": self.steps, "identical_steps": self.identical_steps,
                "identical": self.identical, "recorded_steps": self.recorded_steps,
                "stopped": self.stopped, "until": self.until, "quit_at": self.quit_at,
                "out": None if self.recorded is None else self.recorded.as_dict(),
                "notes": list(self.notes),
                "whatif": None if self.whatif is None else self.whatif.as_dict(),
                "first_divergence": None if f is None else {
                    "step": f.step, "request": f.request, "field": f.field,
                    "text": f.difference}}


def _in_words(step: int, d: Difference | None) -> StepResult:
    if d is None:
        return StepResult(step, True, None)
    return StepResult(step, False, f"step {step:,}: {d.text}", d.request, d.field)


def _mask(plain: dict) -> dict:
    out = dict(plain)
    out["scheduled_new_reqs"] = [{k: v for k, v in r.items() if k not in _REDACTED_NEW}
                                 for r in plain["scheduled_new_reqs"]]
    cached = dict(plain["scheduled_cached_reqs"])
    cached.pop("all_token_ids", None)
    out["scheduled_cached_reqs"] = cached
    return out


def _cut_prompt(row: dict, n: int, block_size: int) -> dict:
    """An input log's add with only the first `n` prompt tokens (and their block hashes)."""
    row = dict(row)
    if row["prompt_token_ids"] is not None:
        row["prompt_token_ids"] = row["prompt_token_ids"][:n]
    n = min(n, row["num_prompt_tokens"] or n)
    row["num_prompt_tokens"] = n
    if row["prompt_block_hashes"] is not None:
        row["prompt_block_hashes"] = row["prompt_block_hashes"][:n // block_size]
    return row


class Resim:
    """Iterate for one StepResult per recorded step (in step order as their updates come);
    `summary` afterwards (it runs what is left first). Built by resim(): everything that makes
    the input unusable raises TraceError there, before the first step."""

    def __init__(self, engine, inputs: Inputs, built: building.Built, rebuilt: Any,
                 notes: list[str], break_at: int | None = None, hook: Any = None,
                 until: int | None = None, out: Path | None = None,
                 source: dict | None = None, whatif: bool = False,
                 arrivals: str = "step", keep: frozenset[str] | None = None,
                 check_recording: bool = True, trim: dict | None = None) -> None:
        from vllm_contract.replay.resim.feed import Requests

        self.engine, self.inputs, self.built, self.rebuilt = engine, inputs, built, rebuilt
        self.scheduler = built.scheduler
        self.requests = Requests(built.block_hasher, self.scheduler.structured_output_manager)
        self.requests.on_release = inputs.outputs.release
        self.redacted = bool(engine.manifest.get("redacted_prompts"))
        # sync speculative decoding: the worker's drafts come back through the scheduler
        # (an input log has them: given as recorded)
        self.drafts = (bool(built.settings.get("speculative")) and inputs.in_flight <= 1
                       and not inputs.logged)
        self._queue: list[Call] = []  # an input log's calls since the last schedule/update
        self._args: tuple[list, dict] = ([], {})  # schedule()'s, as last logged
        self._given = _request_params()
        self.summary_ = Summary(engine.name, built.cls_name, notes=notes,
                                recorded_steps=len(inputs.plains))
        self._pending: dict[int, list] = {}
        self._lens: dict[tuple[int, str], int] | None = None  # redacted: prompt lengths
        self._ran = False
        self.break_at, self.hook, self.until = break_at, hook or debug.pdb_hook, until
        self.out, self.source = out, source or {}
        self._in_hook = False
        self.whatif = whatif
        self.arrivals = arrivals  # a what-if run's: "step" (index) or "time"
        self.keep = keep  # a what-if run's requests, by id (reduce.py): None, all of them
        self.check_recording = check_recording  # a what-if --out: the recording checked too
        # a what-if run's shorter requests (reduce.py): id -> (prompt tokens, output tokens),
        # either None for the recorded length
        self.trim = trim or {}

    @property
    def total_steps(self) -> int:
        return len(self.inputs.plains)

    @property
    def notes(self) -> list[str]:
        return self.summary_.notes

    def __iter__(self) -> Iterator[StepResult]:
        if self._ran:
            raise RuntimeError("a Resim runs once: call resim() again for another run")
        self._ran = True
        run = self._run_whatif if self.whatif else self._run
        if self.out is None:
            yield from self._frozen(run)
            return
        recorder = record.start(self.scheduler, self.out, self.source)
        try:
            yield from self._frozen(run)
        finally:  # sealed even when the caller stops iterating: a trace cut short is a trace
            recorder.close()
        self.summary_.recorded = record.check(record.Recorded(str(self.out)))
        if self.whatif and self.summary_.whatif is not None and self.check_recording:
            original = record.check(record.Recorded(self.source.get("trace", "")))
            self.summary_.whatif.recording.update(_findings(original))
            self.summary_.whatif.rerun.update(_findings(self.summary_.recorded))

    @staticmethod
    def _frozen(run) -> Iterator[StepResult]:
        """The run with the heap built so far (vLLM's modules, the scheduler, the derived
        inputs) out of the collector's reach, as vLLM's engine core freezes its startup heap
        before it schedules; the caller's process gets its collector back afterwards."""
        import gc

        gc.collect()
        gc.freeze()
        try:
            yield from run()
        finally:
            gc.unfreeze()

    def _run_whatif(self) -> Iterator[StepResult]:
        """The what-if run (whatif.py): its own steps until every request has finished, each
        compared with the recording's step of the same index while the recording has one."""
        from vllm_contract.replay.resim import whatif

        self.inputs.outputs.load_all()  # any request's whole stream, at any step
        driver = whatif.Driver(self)
        step = None
        try:
            for step, plain in driver.steps():
                rec = self.inputs.plains.get(step)
                if rec is None:
                    yield self._count(StepResult(step, False, f"step {step:,}: the recording "
                                                 "had drained; the re-run goes on", None,
                                                 "steps"))
                    continue
                if self.redacted:
                    rec, plain = _mask(rec), _mask(plain)
                yield self._count(_in_words(step, first_difference(rec, plain)))
        except bdb.BdbQuit:
            self.summary_.quit_at = step
        except Exception as e:  # the re-run's scheduler broke: the measures up to there
            if self._in_hook:
                raise
            yield self._count(StepResult(
                -1 if step is None else step + 1, False, f"the re-run's scheduler raised "
                f"{type(e).__name__}: {' '.join(str(e).split())}", None, "exception"))
            self.summary_.stopped = True
        self.summary_.until = self.until
        self.summary_.whatif = whatif.Comparison(
            whatif.recorded_side(self.inputs), whatif.measure(driver.facts, driver.added),
            driver.notes)

    def _break_whatif(self, step: int) -> None:
        """The break hook in a what-if run: the requests are added already."""
        self._stop_at(step, [])

    def _stop_at(self, step: int, pending: list) -> list:
        """The break hook, given the calls `pending` before `step`'s schedule(); the calls
        left in the stop's list when it returns (schedule() itself taken out), to be made."""
        stop = debug.Break(step, self.scheduler, pending + [debug.Pending("schedule")],
                           self.inputs.plains.get(step) or {},
                           list(self.inputs.finishes.get(step, [])), self)
        self._in_hook = True
        try:
            self.hook(stop)
        finally:
            self._in_hook = False
        return [p for p in stop.pending if p.call != "schedule"]

    def _run(self) -> Iterator[StepResult]:
        call = None
        try:
            for call in self.inputs.calls:
                if call.kind == "schedule":
                    self._schedule(call.step)
                elif call.kind == "update":
                    self._feed(self._pending_calls())
                    if call.step in self._pending:
                        yield self._count(self._update(call.step))
                    if self._until_reached(call.step):
                        break
                elif self.inputs.logged:
                    self._queue.append(call)
                else:
                    self._abort(call)
            self._feed(self._pending_calls())
        except bdb.BdbQuit:  # `q` in the debugger, at the break or in a breakpoint set from it
            self.summary_.quit_at = call.step
            self._pending.clear()
            return
        except Exception as e:  # the re-run's scheduler (a patched one, say) broke: a result
            if self._in_hook:  # the hook's own error (a test's assert, say): the caller's
                raise
            self._pending.pop(call.step, None)
            yield self._count(StepResult(
                call.step, False, f"step {call.step:,}: the re-run's scheduler raised "
                f"{type(e).__name__} in {call.kind}: {' '.join(str(e).split())}", None,
                "exception"))
            self.summary_.stopped = True
            return
        for step in sorted(self._pending):  # batches never updated in the recording
            so, chunks, diff = self._pending.pop(step)
            if self.until is None or step <= self.until:
                yield self._count(_in_words(step, diff))
        self.summary_.until = self.until

    def _until_reached(self, step: int) -> bool:
        """Every step up to --until has its result; steps scheduled past it (batches in
        flight) are left unanswered."""
        return (self.until is not None and step >= self.until
                and all(s > self.until for s in self._pending))

    def _count(self, r: StepResult) -> StepResult:
        s = self.summary_
        s.steps += 1
        s.identical_steps += r.identical
        if not r.identical and (s.first is None or r.step < s.first.step):
            s.first = r
        return r

    @property
    def summary(self) -> Summary:
        if not self._ran:
            for _ in self:
                pass
        return self.summary_

    def _schedule(self, step: int) -> None:
        plain = self.inputs.plains[step]
        if self.inputs.logged:
            self._schedule_logged(step, plain)
            return
        new = []
        if plain["scheduled_new_reqs"]:
            for nr in self.rebuilt.build_step(step, plain).scheduled_new_reqs:
                if nr.req_id in self.scheduler.requests:  # the re-run still holds it: diverged
                    continue
                if self.redacted:
                    nr.prompt_token_ids = [3] * self._prompt_len(step, nr.req_id)
                new.append(self.requests.from_new(nr))
        if step == self.break_at:
            new = self._break(step, new)
        for req in new:
            self.scheduler.add_request(req)
        self._compare(step, plain, self.scheduler.schedule())

    def _compare(self, step: int, plain: dict, so: Any) -> None:
        from vllm_contract.replay.worker.canonical import from_live

        reqs = self.scheduler.requests
        chunks = {rid: reqs[rid].is_prefill_chunk for rid in so.num_scheduled_tokens
                  if rid in reqs}
        run = from_live(so)
        rec = plain
        if self.redacted:
            rec, run = _mask(rec), _mask(run)
        self._pending[step] = [so, chunks, first_difference(rec, run)]

    def _schedule_logged(self, step: int, plain: dict) -> None:
        """An input log's step: the calls logged since the last one (the break hook sees
        them first), then schedule() with its logged arguments."""
        pending = self._pending_calls()
        if step == self.break_at:
            pending = self._stop_at(step, pending)
        self._feed(pending)
        self._args = self.inputs.schedule_args.get(step, self._args)
        args, kwargs = self._args
        self._compare(step, plain, self.scheduler.schedule(*args, **kwargs))

    def _pending_calls(self) -> list:
        """The queued input-log calls as debug.Pending entries (adds with their Request)."""
        out = []
        for c in self._queue:
            if c.kind == "add":
                out.append(debug.Pending("add_request", self.logged_request(c.data)))
            elif c.kind == "abort":
                out.append(debug.Pending("finish_requests", args=(c.req_id, c.status)))
            else:
                name = ("update_draft_token_ids" if c.kind == "drafts"
                        else "update_draft_token_ids_in_output")
                out.append(debug.Pending(name, args=c.data))
        self._queue = []
        return out

    def logged_request(self, seq: int) -> Any:
        """The Request of the input log's add_request() at `seq`, as the installed vLLM
        builds it (also for a what-if run's arrivals)."""
        row = self.inputs.added.row(seq)
        prompt, outputs = self.trim.get(row["req_id"], (None, None))
        if prompt is not None:
            row = _cut_prompt(row, prompt, int(self.built.settings["block_size"]))
        req = self.requests.from_added(row, self.rebuilt.decode, self._others(row))
        if outputs is not None:  # the scheduler stops it there itself (a length cap)
            sp = req.sampling_params
            req.max_tokens = sp.max_tokens = min(outputs, req.max_tokens)
            sp.min_tokens = min(sp.min_tokens, sp.max_tokens)
        return req

    def _others(self, row: dict) -> dict:
        """The logged Request arguments without a column, those the installed Request takes
        (a value it cannot take as plain data is left at its default, with a note)."""
        import json

        out = {}
        for k, v in json.loads(row["other_json"] or "{}").items():
            if k not in self._given:
                self._note_once(f"Request argument {k}: logged, but the installed vLLM's "
                                "Request lacks it: left out")
            elif is_opaque(v) or (isinstance(v, dict) and "__type__" in v):
                self._note_once(f"Request argument {k}: not plain data in the log: left at "
                                "its default")
            else:
                out[k] = v
        return out

    def _note_once(self, text: str) -> None:
        if text not in self.summary_.notes:
            self.summary_.notes.append(text)

    def _feed(self, pending: list) -> None:
        from vllm.v1.outputs import DraftTokenIds

        for p in pending:
            if p.call == "add_request":
                if p.request.request_id not in self.scheduler.requests:  # else diverged
                    self.scheduler.add_request(p.request)
            elif p.call == "finish_requests":
                self._abort(Call("abort", -1, *p.args))
            elif p.call == "update_draft_token_ids":
                req_ids, lists, _ = p.args
                self.scheduler.update_draft_token_ids(DraftTokenIds(list(req_ids),
                                                                    [list(x) for x in lists]))
            elif p.call == "update_draft_token_ids_in_output":
                req_ids, lists, into = p.args
                held = self._pending.get(into)
                if held is not None:
                    self.scheduler.update_draft_token_ids_in_output(
                        DraftTokenIds(list(req_ids), [list(x) for x in lists]), held[0])

    def _break(self, step: int, new: list) -> list:
        """The hook, given what the step is about to feed; the requests to add after it."""
        left = self._stop_at(step, [debug.Pending("add_request", r) for r in new])
        return [p.request for p in left if p.call == "add_request"]

    def _prompt_len(self, step: int, req_id: str) -> int:
        if self._lens is None:
            rows = self.engine.read("requests", ["step", "req_id", "prompt_len"]).to_pylist()
            self._lens = {(r["step"], r["req_id"]): r["prompt_len"] or 1 for r in rows}
        return self._lens.get((step, req_id), 1)

    def _update(self, step: int) -> StepResult:
        from vllm_contract.replay.resim.feed import finishes_of, model_output

        so, chunks, diff = self._pending.pop(step)
        if so.has_structured_output_requests:  # as the engine does before it executes
            self.scheduler.get_grammar_bitmask(so)
        mro = model_output(so, chunks, step, self.scheduler, self.requests, self.inputs.outputs)
        outs = self.scheduler.update_from_output(so, mro)
        diff = diff or finish_difference(self.inputs.finishes.get(step, []), finishes_of(outs))
        if self.drafts:
            self._give_drafts(step, mro.req_ids)
        return _in_words(step, diff)

    def _give_drafts(self, step: int, req_ids: list[str]) -> None:
        from vllm.v1.outputs import DraftTokenIds

        reqs = self.scheduler.requests
        live = [r for r in req_ids if r in reqs and not reqs[r].is_finished()]
        drafts = [self.inputs.next_drafts(r, step) for r in live]
        self.scheduler.update_draft_token_ids(DraftTokenIds(live, drafts))

    def _abort(self, call: Call) -> None:
        from vllm.v1.request import RequestStatus

        status = RequestStatus.__members__.get(call.status or "", RequestStatus.FINISHED_ABORTED)
        if not RequestStatus.is_finished(status):
            status = RequestStatus.FINISHED_ABORTED
        if call.req_id not in self.scheduler.requests:
            if self.inputs.logged:  # finished already, or never added: vLLM ignores it
                return
            self.scheduler.add_request(self.requests.phantom(call.req_id))
        # one id a call: with several, finish_requests frees them in set order, which is
        # PYTHONHASHSEED's, and the block ids handed out next would follow it
        self.scheduler.finish_requests(call.req_id, status)


def _request_params() -> set[str]:
    import inspect

    from vllm.v1.request import Request

    return set(inspect.signature(Request.__init__).parameters) - {"self"}


def _findings(rec: record.Recorded) -> dict:
    return {"errors": rec.errors, "warnings": rec.warnings, "findings": rec.findings}


def _open(trace_path: str | Path, engine: str | None):
    from vllm_contract.replay.worker.plan import pick_engine
    from vllm_contract.trace import open_trace

    return pick_engine(open_trace(trace_path), engine)


def cannot_reproduce(engine: dict) -> list[str]:
    """What the recording's engine did that a re-run with no worker cannot: said in one note,
    the run goes on (the scheduler's decisions up to where they depend on it still count)."""
    out = []
    if engine.get("kv_connector"):
        out.append(f"the KV connector's transfers ({engine['kv_connector']}): the re-run's "
                   "outputs report no finished sends or receives, so requests waiting on a "
                   "remote KV load are scheduled as if it never came")
    if engine.get("runner_type") == "pooling":
        out.append("pooling outputs: the re-run's outputs carry no pooler output, so pooling "
                   "requests do not finish as they did")
    return out


def resim(trace_path: str | Path, engine: str | None = None, scheduler_cls: str | None = None,
          overrides: dict | None = None, *, break_at: int | None = None,
          break_hook: Any = None, until: int | None = None,
          out: str | Path | None = None, whatif: bool = False,
          arrivals: str = "step", keep: Any = None, check_recording: bool = True,
          trim: dict | None = None) -> Resim:
    """Re-run the installed vLLM Scheduler (or `scheduler_cls`, "module:Class") on a recorded
    trace; `overrides`: manifest engine settings to change (build.SETTINGS). `break_at`: call
    `break_hook` (a callable or "module:function"; default pdb) with a debug.Break just before
    that step's schedule(); `until`: stop after that step; `out`: record the re-run into a new
    trace there and run the catalog on it. `whatif`: divergence expected (docs/resim.md,
    "What-if runs"): the re-run goes on until every request has finished and the summary's
    `whatif` compares it with the recording; `arrivals` ("step" or "time") how a what-if run
    places the requests (docs/resim.md); `keep`: a what-if run of only the requests with
    these ids (their adds and aborts; the input log's); `trim`: a what-if run's requests cut
    shorter, id -> (prompt tokens, output tokens), None for either kept as recorded (the first
    tokens of the prompt, the output capped by max_tokens); `check_recording`: a what-if run's
    comparison has the catalog's findings on the recording too. Raises TraceError for unusable
    input."""
    from vllm_contract.replay.worker.rebuild import rebuild

    if arrivals not in ("step", "time"):
        raise TraceError(f"--arrivals {arrivals}: use step or time")
    if arrivals == "time" and not whatif:
        raise TraceError("--arrivals time is for a what-if run (--set or --scheduler-cls): "
                         "a re-run of the recording adds each request where it was added")
    overrides = building.named(overrides) or None
    eng = _open(trace_path, engine)
    inputs = derive(eng)
    if (keep is not None or trim) and not (whatif and inputs.logged):
        raise TraceError("a run of some of the requests, or of shorter ones, is a what-if run "
                         "of a trace with an input log (format 3)")
    if arrivals == "time" and not inputs.logged:
        raise TraceError("--arrivals time needs the recorded arrival times: the trace has no "
                         "input log (format 2 or before)")
    debug.check_step("--break-at", break_at, inputs.plains)
    debug.check_step("--until", until, inputs.plains)
    if break_at is not None and until is not None and break_at > until:
        raise TraceError(f"--break-at {break_at} is after --until {until}: the run stops first")
    if break_hook is not None and break_at is None:
        raise TraceError("--break-hook needs --break-at STEP: it is called at that step")
    hook = debug.hook_of(break_hook) if break_at is not None else None
    if out is not None:
        record.refuse_used(Path(out))
    settings = building.settings_of(eng, overrides)
    if (eng.manifest.get("redacted_prompts") and settings.get("enable_prefix_caching")
            and not inputs.logged):
        raise TraceError("the trace was recorded with redacted prompts and prefix caching on: "
                         "cache hits depend on the prompt tokens, which the trace lacks")
    cls, name = building.scheduler_class(scheduler_cls, eng, inputs.in_flight)
    notes = [log.NOTE if inputs.logged else DERIVED]
    recorded = (eng.manifest.get("engine") or {}).get("scheduler_class")
    if recorded and recorded != name.replace(":", "."):
        notes.append(f"recorded with {recorded}; re-run with {name}")
    if overrides:
        notes.append("settings overridden: " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
        if lacking := building.not_applied(overrides):
            notes.append(f"not applied, the installed vLLM has no such setting: "
                         f"{', '.join(lacking)}")
    rebuilt = rebuild(eng)
    if rebuilt.drift:
        notes.append(f"recorded by vLLM {eng.manifest.get('vllm_version')}, re-run on "
                     f"{rebuilt.installed_version}, whose classes differ: "
                     + "; ".join(rebuilt.drift))
    built = building.build(settings, cls, name, inputs.structured)
    if not overrides or not {"num_kv_blocks", "block_size"} & set(overrides):
        notes += building.start_from(built.scheduler, eng.manifest.get("kv_cache_at_start"))
    if beyond := cannot_reproduce(eng.manifest.get("engine") or {}):
        notes.append("not reproduced: " + "; ".join(beyond))
    # a manifest older than these settings: the re-run takes vLLM's defaults for them
    unrecorded = built.unrecorded + ([] if inputs.logged else ["cache salts"])
    if unrecorded:
        notes.append("not recorded, so vLLM's defaults: " + ", ".join(unrecorded))
    source = {"trace": str(trace_path), "engine": eng.name, "scheduler_class": name,
              "overrides": {k: v if v is None or isinstance(v, (bool, int, float, str))
                            else str(v) for k, v in (overrides or {}).items()}}
    if whatif:
        where = ("arrivals by recorded arrival time on a clock advanced by the recorded step "
                 "durations" if arrivals == "time" else "arrivals at the recording's step index")
        notes.append(f"what-if run: {where}, aborts before the "
                     "step the recording fed them before, one batch in flight, no drafts; a "
                     "request is finished when it has used all its recorded outputs")
    return Resim(eng, inputs, built, rebuilt, notes, break_at, hook, until,
                 None if out is None else Path(out), source, whatif, arrivals,
                 None if keep is None else frozenset(keep), check_recording, trim)
