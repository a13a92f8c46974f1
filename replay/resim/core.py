"""What the strict re-run (run.py) and the what-if run (whatif_run.py) share: the results,
the summary, and `ResimRun`, the stepping core both are built on: it runs once, records the
run when asked, stops at the break step and makes a logged request as the installed vLLM
does. The subclass supplies `_steps()`, its loop over the steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from vllm_contract.plain import is_opaque
from vllm_contract.replay.resim import build as building
from vllm_contract.replay.resim import debug, record
from vllm_contract.replay.resim.inputs import Inputs
from vllm_contract.replay.resim.options import ResimOptions
from vllm_contract.replay.resim.words import Difference

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


@dataclass(frozen=True)
class Setup:
    """What resim() made of the trace and the options before the first step."""
    engine: Any  # the recording's EngineTrace
    inputs: Inputs
    built: building.Built
    rebuilt: Any  # worker/rebuild.py's: the installed vLLM's objects of a recorded step
    notes: list[str]  # the summary's notes so far; the run adds its own
    source: dict  # what the re-run's own trace (--out) says it re-ran
    hook: Callable[[debug.Break], Any] | None = None  # --break-at's, resolved; None: pdb


def in_words(step: int, d: Difference | None) -> StepResult:
    if d is None:
        return StepResult(step, True, None)
    return StepResult(step, False, f"step {step:,}: {d.text}", d.request, d.field)


def mask(plain: dict) -> dict:
    """A canonical SchedulerOutput without what a redacted recording lacks."""
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


class ResimRun:
    """Iterate for one StepResult per step; `summary` afterwards (it runs what is left
    first). Built by resim(): everything that makes the input unusable raises TraceError
    there, before the first step.

    What a run's stepping (and whatif.Driver) may use: `engine`, `inputs`, `built`,
    `rebuilt`, `scheduler`, `requests` (feed.Requests), `redacted`, `options`,
    `logged_request()`, `prompt_len()` and `stop_at()`."""

    def __init__(self, setup: Setup, options: ResimOptions) -> None:
        from vllm_contract.replay.resim.feed import Requests

        self.engine, self.inputs = setup.engine, setup.inputs
        self.built, self.rebuilt, self.source = setup.built, setup.rebuilt, setup.source
        self.options = options
        self.scheduler = setup.built.scheduler
        self.requests = Requests(setup.built.block_hasher,
                                 self.scheduler.structured_output_manager)
        self.requests.on_release = setup.inputs.outputs.release
        self.redacted = bool(setup.engine.manifest.get("redacted_prompts"))
        self.hook = setup.hook or debug.pdb_hook
        self.summary_ = Summary(setup.engine.name, setup.built.cls_name, notes=setup.notes,
                                recorded_steps=len(setup.inputs.plains))
        self._given = _request_params()
        self._lens: dict[tuple[int, str], int] | None = None  # redacted: prompt lengths
        self._ran = False
        self._in_hook = False

    @property
    def total_steps(self) -> int:
        return len(self.inputs.plains)

    @property
    def notes(self) -> list[str]:
        return self.summary_.notes

    @property
    def summary(self) -> Summary:
        if not self._ran:
            for _ in self:
                pass
        return self.summary_

    def __iter__(self) -> Iterator[StepResult]:
        if self._ran:
            raise RuntimeError("a Resim runs once: call resim() again for another run")
        self._ran = True
        out = self.options.out
        if out is None:
            yield from self._frozen()
            return
        recorder = record.start(self.scheduler, out, self.source)
        try:
            yield from self._frozen()
        finally:  # sealed even when the caller stops iterating: a trace cut short is a trace
            recorder.close()
        self.summary_.recorded = record.check(record.Recorded(str(out)))
        self._checked()

    def _steps(self) -> Iterator[StepResult]:
        raise NotImplementedError

    def _checked(self) -> None:
        """Called once the re-run's own trace (--out) has the catalog's findings."""

    def _frozen(self) -> Iterator[StepResult]:
        """The run with the heap built so far (vLLM's modules, the scheduler, the derived
        inputs) out of the collector's reach, as vLLM's engine core freezes its startup heap
        before it schedules; the caller's process gets its collector back afterwards."""
        import gc

        gc.collect()
        gc.freeze()
        try:
            yield from self._steps()
        finally:
            gc.unfreeze()

    def _count(self, r: StepResult) -> StepResult:
        s = self.summary_
        s.steps += 1
        s.identical_steps += r.identical
        if not r.identical and (s.first is None or r.step < s.first.step):
            s.first = r
        return r

    def stop_at(self, step: int, pending: list) -> list:
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

    def logged_request(self, seq: int) -> Any:
        """The Request of the input log's add_request() at `seq`, as the installed vLLM
        builds it (also for a what-if run's arrivals)."""
        row = self.inputs.added.row(seq)
        prompt, outputs = (self.options.trim or {}).get(row["req_id"], (None, None))
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

    def prompt_len(self, step: int, req_id: str) -> int:
        """A redacted recording's prompt length of `req_id` where `step` scheduled it new."""
        if self._lens is None:
            rows = self.engine.read("requests", ["step", "req_id", "prompt_len"]).to_pylist()
            self._lens = {(r["step"], r["req_id"]): r["prompt_len"] or 1 for r in rows}
        return self._lens.get((step, req_id), 1)


def _request_params() -> set[str]:
    import inspect

    from vllm.v1.request import Request

    return set(inspect.signature(Request.__init__).parameters) - {"self"}
