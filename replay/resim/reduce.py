"""`vllm-contract reduce`: a recording with a finding cut down to the fewest requests and
steps whose re-run still shows it (docs/reduce.md). A candidate is always a valid execution:
some of the recorded requests, each with its own adds, aborts and recorded tokens, re-run by
the real scheduler (a what-if run, whatif.py, of only those requests) up to a step; never an
edit of the emitted outputs. The test of a candidate is that run recorded and checked with the
catalog: interesting when it has a finding of the asked invariant and none the original
recording lacked (no `trace.*`)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from vllm_contract.errors import TraceError
from vllm_contract.replay.resim.record import catalog_findings


# the engine settings a reduction shrinks, in this order (a block bug shows in a smaller
# cache, a budget bug in a smaller budget), each to the least that keeps the finding
CONFIG = ("num_kv_blocks", "max_num_batched_tokens", "max_num_seqs")


@dataclass(frozen=True)
class Candidate:
    requests: tuple[str, ...]  # the kept requests' ids, in their order of first add
    until: int | None = None  # the re-run stops after this step of the recording's clock
    # (id, prompt tokens, output tokens) of the requests cut shorter, None: as recorded
    trim: tuple[tuple[str, int | None, int | None], ...] = ()
    sets: tuple[tuple[str, int], ...] = ()  # engine settings made smaller (CONFIG)

    def cut(self, rid: str) -> tuple[int | None, int | None]:
        return next(((p, o) for r, p, o in self.trim if r == rid), (None, None))

    def with_cut(self, rid: str, prompt: int | None, outputs: int | None) -> "Candidate":
        rest = tuple(t for t in self.trim if t[0] != rid)
        return replace(self, trim=tuple(sorted(rest + ((rid, prompt, outputs),))))

    def with_set(self, key: str, value: int) -> "Candidate":
        rest = tuple(kv for kv in self.sets if kv[0] != key)
        return replace(self, sets=tuple(sorted(rest + ((key, value),))))


@dataclass
class Outcome:
    interesting: bool
    steps: int = 0
    findings: list[Any] = field(default_factory=list)  # the catalog's, at warning or above
    trace: Path | None = None
    error: str | None = None  # the candidate could not be built


@dataclass
class Result:
    invariant: str
    original_requests: int
    original_steps: int
    best: Candidate
    best_steps: int
    calls: int
    seconds: float
    stopped: str | None = None  # why it ended early: "--max-seconds", "interrupted"
    findings: list[Any] = field(default_factory=list)
    trace: Path | None = None
    pytest_file: Path | None = None
    no_pytest: str | None = None  # why no pytest file was written
    # id -> (prompt tokens, outputs) recorded, of the kept requests; settings recorded
    lengths: dict[str, tuple[int, int]] = field(default_factory=dict)
    config: dict[str, int] = field(default_factory=dict)

    def cuts(self) -> dict[str, dict]:
        """The kept requests cut shorter: id -> prompt/outputs, as reduced and as recorded."""
        out = {}
        for rid, prompt, outputs in self.best.trim:
            if rid in self.best.requests:
                whole = self.lengths.get(rid, (None, None))
                out[rid] = {"prompt_tokens": prompt or whole[0], "prompt_tokens_recorded":
                            whole[0], "outputs": outputs or whole[1],
                            "outputs_recorded": whole[1]}
        return out

    def settings(self) -> dict[str, dict]:
        """The settings made smaller: key -> reduced and recorded value."""
        return {k: {"value": v, "recorded": self.config.get(k)} for k, v in self.best.sets}

    def as_dict(self) -> dict:
        return {"invariant": self.invariant, "requests_before": self.original_requests,
                "requests_after": len(self.best.requests), "requests": list(self.best.requests),
                "steps_before": self.original_steps, "steps_after": self.best_steps,
                "until": self.best.until, "cuts": self.cuts(), "settings": self.settings(),
                "calls": self.calls,
                "seconds": round(self.seconds, 2), "stopped": self.stopped,
                "trace": None if self.trace is None else str(self.trace),
                "pytest_file": None if self.pytest_file is None else str(self.pytest_file),
                "no_pytest_file": self.no_pytest,
                "findings": [_said(f) for f in self.findings]}


def _said(f: Any) -> str:
    where = f" at step {f.step}" if f.step is not None else ""
    return f"{f.invariant}{where}" + (f" ({f.req_id})" if f.req_id else "")


class _Stop(Exception):
    """--max-seconds reached: the best candidate so far is the result."""


def _re_run(job: dict) -> Outcome:
    """One candidate re-run and checked (in this process or a pool's)."""
    from vllm_contract.replay.resim.options import ResimOptions
    from vllm_contract.replay.resim.prepare import resim

    out = Path(job["out"])
    # the original's findings are known: not checked again
    try:
        run = resim(job["trace"], ResimOptions(
            engine=job["engine"], scheduler_cls=job["cls"], overrides=job["sets"] or None,
            whatif=True, keep=job["keep"], until=job["until"], out=out,
            check_recording=False, trim=job["trim"]))
    except (TraceError, ValueError) as e:  # a setting vLLM refuses (a budget below a prompt)
        shutil.rmtree(out, ignore_errors=True)
        return Outcome(False, error=str(e))
    steps = sum(1 for _ in run)
    rec = run.summary.recorded
    found = list(rec.found or []) if rec is not None else []
    hit = [f for f in found if f.invariant == job["invariant"]
           and (job["req"] is None or f.req_id == job["req"])]
    other = {f.invariant for f in found} - set(job["allowed"]) - {job["invariant"]}
    return Outcome(bool(hit) and not other and not run.summary.stopped, steps, found, out)


def _quiet_worker() -> None:
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


class Reducer:
    """ddmin over the recorded requests, then one at a time, then the step tail, repeated to
    a fixpoint; every candidate re-run once (cached by its content)."""

    def __init__(self, trace: Path, invariant: str, work: Path, *, engine: str | None = None,
                 scheduler_cls: str | None = None, req: str | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.trace, self.invariant, self.work = Path(trace), invariant, Path(work)
        self.engine, self.scheduler_cls, self.req = engine, scheduler_cls, req
        self.deadline: float | None = None  # time.monotonic() past which no re-run starts
        self.progress = progress or (lambda text: None)
        self.cache: dict[Candidate, Outcome] = {}
        self.calls = 0
        self.allowed: set[str] = set()  # the invariants the original recording has
        self.best: Candidate | None = None
        self.best_outcome: Outcome | None = None
        self.pool: Any = None  # --jobs N > 1: a process pool re-running candidates
        # id -> (prompt tokens, recorded outputs) of the requests that can be cut shorter
        self.lengths: dict[str, tuple[int, int]] = {}
        self.config: dict[str, int] = {}  # the recorded CONFIG settings

    # -- the test ----------------------------------------------------------------------------
    def test(self, cand: Candidate) -> bool:
        return self.first_interesting([cand]) is not None

    def first_interesting(self, cands: list[Candidate]) -> Candidate | None:
        """The first of `cands` that is interesting, or None; with a pool (--jobs) those not
        cached yet are re-run side by side, so the answer is the one a serial run gives."""
        todo = [c for c in dict.fromkeys(cands) if c not in self.cache]
        if self.pool is None or len(todo) < 2:
            for c in cands:
                if c not in self.cache:
                    self._stop_if_late()
                    self._record(c, _re_run(self._job(c, self._next_out())))
                if self.cache[c].interesting:
                    return c
            return None
        self._stop_if_late()
        futures = {c: self.pool.submit(_re_run, self._job(c, self._next_out())) for c in todo}
        try:
            for c in cands:
                if c in futures:
                    self._record(c, futures.pop(c).result())
                if self.cache[c].interesting:
                    return c
            return None
        finally:
            for f in futures.values():  # not needed now: left unread (their traces too)
                f.cancel()

    def _stop_if_late(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _Stop

    def _next_out(self) -> Path:
        self.calls += 1
        return self.work / f"candidate-{self.calls}"

    def _job(self, cand: Candidate, out: Path) -> dict:
        kept = set(cand.requests)
        return {"trace": str(self.trace), "engine": self.engine, "cls": self.scheduler_cls,
                "keep": cand.requests, "until": cand.until, "out": str(out),
                "trim": {r: (p, o) for r, p, o in cand.trim if r in kept},
                "sets": dict(cand.sets),
                "invariant": self.invariant, "req": self.req, "allowed": sorted(self.allowed)}

    def _record(self, cand: Candidate, outcome: Outcome) -> None:
        self.cache[cand] = outcome
        if outcome.interesting and (self.best_outcome is None or self.size(cand, outcome)
                                    < self.size(self.best, self.best_outcome)):
            if self.best_outcome is not None and self.best_outcome.trace is not None:
                shutil.rmtree(self.best_outcome.trace, ignore_errors=True)
            self.best, self.best_outcome = cand, outcome
        elif outcome.trace is not None and outcome.trace.exists():
            shutil.rmtree(outcome.trace, ignore_errors=True)
        self.progress(f"reducing {self.invariant}: {len(self.best.requests) if self.best else '-'}"
                      f" request(s), {self.best_outcome.steps if self.best_outcome else '-'} "
                      f"step(s); {self.calls} re-run(s)")

    def size(self, cand: Candidate, outcome: Outcome) -> tuple:
        """Smaller is better: requests, then steps, then tokens, then the settings."""
        tokens = 0
        for r in cand.requests:
            prompt, outputs = cand.cut(r)
            whole = self.lengths.get(r, (0, 0))
            tokens += (whole[0] if prompt is None else prompt) + (
                whole[1] if outputs is None else outputs)
        sets = dict(cand.sets)
        return (len(cand.requests), outcome.steps, tokens,
                *(sets.get(k, self.config.get(k) or 0) for k in CONFIG))

    # -- the strategy ------------------------------------------------------------------------
    def ddmin(self, cand: Candidate) -> Candidate:
        """Zeller's ddmin over the requests (the pinned --req never removed)."""
        pinned = [r for r in cand.requests if r == self.req]
        items = [r for r in cand.requests if r != self.req]
        n = 2
        while len(items) >= 2:
            size = max(1, len(items) // n)
            chunks = [items[i:i + size] for i in range(0, len(items), size)]
            reduced = False
            subsets = [self._with(cand, pinned, chunk) for chunk in chunks]
            hit = self.first_interesting(subsets)  # a subset alone
            if hit is not None:
                items, n, reduced = list(chunks[subsets.index(hit)]), 2, True
            elif len(chunks) > 2:
                rests = [[r for j, ch in enumerate(chunks) if j != i for r in ch]
                         for i in range(len(chunks))]
                comps = [self._with(cand, pinned, rest) for rest in rests]
                hit = self.first_interesting(comps)  # a complement
                if hit is not None:
                    items, n, reduced = rests[comps.index(hit)], max(n - 1, 2), True
            if not reduced:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
        return self._with(cand, pinned, items)

    def one_at_a_time(self, cand: Candidate) -> Candidate:
        for r in list(cand.requests):
            if r == self.req or len(cand.requests) == 1:
                continue
            c = replace(cand, requests=tuple(x for x in cand.requests if x != r))
            if self.test(c):
                cand = c
        return cand

    def tail(self, cand: Candidate, first: int, last: int) -> Candidate:
        """The earliest --until in [first, last] that keeps the finding (a binary search: a
        finding seen by a step stays seen by a later one)."""
        best = self.least(first, last, lambda n: replace(cand, until=n))
        return cand if best is None else replace(cand, until=best)

    def least(self, lo: int, hi: int, make: Callable[[int], Candidate]) -> int | None:
        """The least n in [lo, hi] whose candidate `make(n)` is interesting (a binary search:
        taken to hold from there up), or None when `make(hi)` is not."""
        if hi < lo or not self.test(make(hi)):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self.test(make(mid)):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def shorten(self, cand: Candidate) -> Candidate:
        """Each request's prompt, then its output, to the fewest tokens that keep the finding
        (the prompt's first tokens; the output capped by max_tokens)."""
        for r in cand.requests:
            if r not in self.lengths:
                continue
            prompt, outputs = cand.cut(r)
            whole_prompt, whole_outputs = self.lengths[r]
            p = self.least(1, (prompt or whole_prompt) - 1,
                           lambda n: cand.with_cut(r, n, outputs))
            if p is not None:
                cand, prompt = cand.with_cut(r, p, outputs), p
            o = self.least(1, (outputs or whole_outputs) - 1,
                           lambda n: cand.with_cut(r, prompt, n))
            if o is not None:
                cand = cand.with_cut(r, prompt, o)
        return cand

    def shrink_config(self, cand: Candidate) -> Candidate:
        """Each CONFIG setting to the least that keeps the finding."""
        for key in CONFIG:
            now = dict(cand.sets).get(key, self.config.get(key))
            if not now:
                continue
            n = self.least(1, now - 1, lambda v: cand.with_set(key, v))
            if n is not None:
                cand = cand.with_set(key, n)
        return cand

    def run(self, requests: list[str], first_step: int, last_step: int) -> Candidate:
        cand = Candidate(tuple(requests))
        while True:
            before = cand
            cand = self.one_at_a_time(self.ddmin(cand))
            cand = self.tail(cand, first_step, cand.until if cand.until is not None
                             else last_step)
            cand = self.shrink_config(self.shorten(cand))
            if cand == before:
                return cand

    @staticmethod
    def _with(cand: Candidate, pinned: list[str], items: list[str]) -> Candidate:
        keep = set(pinned) | set(items)
        return replace(cand, requests=tuple(r for r in cand.requests if r in keep),
                       trim=tuple(t for t in cand.trim if t[0] in keep))


def reduce(trace: str | Path, invariant: str, out: str | Path, *, engine: str | None = None,
           scheduler_cls: str | None = None, step: int | None = None, req: str | None = None,
           max_seconds: float | None = None, jobs: int = 1,
           progress: Callable[[str], None] | None = None) -> Result:
    """Reduce `trace` to the fewest requests and steps whose re-run with `scheduler_cls` (the
    one the finding is blamed on; default the installed vLLM's) still has a finding of
    `invariant`; the reduced recording is written to OUT/trace and a report to
    OUT/README.md. `step`/`req`: which of the original's findings (and `req` is kept in every
    candidate, its finding the one looked for); `jobs`: re-runs side by side in that many
    processes (the result is the serial one). Raises TraceError for unusable input and for
    a finding that the re-run of the whole recording does not show."""
    from vllm_contract.replay.resim.inputs import derive
    from vllm_contract.replay.worker.plan import pick_engine
    from vllm_contract.trace import open_trace

    trace, out = Path(trace), Path(out)
    if jobs < 1:
        raise TraceError(f"--jobs {jobs}: give 1 or more")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TraceError(f"--out {out} already exists and is not an empty directory")
    eng = pick_engine(open_trace(trace), engine)
    inputs = derive(eng)
    if not inputs.logged or inputs.added is None:
        raise TraceError("reduce needs the recorded scheduler inputs (format 3, an input log): "
                         "this trace has none; record it again with this version")
    original = [f for f in catalog_findings(trace) if f.engine in (None, eng.name)]
    asked = [f for f in original if f.invariant == invariant
             and (step is None or f.step == step) and (req is None or f.req_id == req)]
    if not asked:
        where = "".join([f" at step {step}" if step is not None else "",
                         f" for {req}" if req is not None else ""])
        have = sorted({f.invariant for f in original})
        raise TraceError(f"the trace has no {invariant} finding{where} (it has: "
                         f"{', '.join(have) if have else 'none'})")
    requests = list(dict.fromkeys(inputs.added.table["req_id"].to_pylist()))
    if req is not None and req not in requests:
        raise TraceError(f"--req {req}: no such request in the input log")
    first, last = min(inputs.plains), max(inputs.plains)
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".candidates"
    r = Reducer(trace, invariant, work, engine=eng.name, scheduler_cls=scheduler_cls, req=req)
    r.allowed = {f.invariant for f in original}
    r.lengths = _lengths(inputs)
    settings = eng.manifest.get("engine") or {}
    r.config = {k: int(settings[k]) for k in CONFIG if settings.get(k)}
    stopped = None
    try:
        whole = r.test(Candidate(tuple(requests)))  # always run: the best is at least this
        error = r.cache[Candidate(tuple(requests))].error
        if error:
            shutil.rmtree(out, ignore_errors=True)
            raise TraceError(f"the re-run of the whole recording could not start: {error}")
        if max_seconds is not None:
            r.deadline = t0 + max_seconds
        r.progress = progress or r.progress  # from here on: the first run is the check
        if whole and jobs > 1:
            r.pool = _pool(jobs)
        if not whole:
            shutil.rmtree(out, ignore_errors=True)
            raise TraceError(f"{invariant} does not survive re-simulation: the scheduler's "
                             "re-run of the recorded inputs does not show it (not the "
                             "scheduler's doing: transport, worker, or an input not "
                             "recorded); try `vllm-contract replay --worker shadow`")
        r.run(requests, first, last)
    except _Stop:
        stopped = "--max-seconds"
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        if r.pool is not None:
            r.pool.shutdown(wait=True, cancel_futures=True)
    best, outcome = r.best, r.best_outcome
    if best is None:  # interrupted in the first re-run: nothing to keep
        shutil.rmtree(out, ignore_errors=True)
        raise KeyboardInterrupt
    reduced = out / "trace"
    shutil.move(str(outcome.trace), reduced)
    shutil.rmtree(work, ignore_errors=True)
    result = Result(invariant, len(requests), len(inputs.plains), best, outcome.steps, r.calls,
                    time.monotonic() - t0, stopped, outcome.findings, reduced,
                    lengths=r.lengths, config=r.config)
    _emit(result, trace, scheduler_cls, out)
    (out / "README.md").write_text(report(result, trace, scheduler_cls, asked[0]))
    return result


def _lengths(inputs: Any) -> dict[str, tuple[int, int]]:
    """id -> (prompt tokens, recorded output tokens) of each request that can be cut shorter:
    one add of the id (a reused id's incarnations would be cut alike), no multimodal input
    (its placeholders sit in the prompt)."""
    from collections import Counter

    inputs.outputs.load_all()
    t = inputs.added.table
    ids = t["req_id"].to_pylist()
    once = {r for r, n in Counter(ids).items() if n == 1}
    out = {}
    for rid, n, mm in zip(ids, t["num_prompt_tokens"].to_pylist(),
                          t["mm_features"].to_pylist()):
        if rid in once and not mm and n:
            out[rid] = (int(n), len(inputs.outputs.streams.get((rid, 0), ())))
    return out


def _pool(jobs: int) -> Any:
    """Processes started afresh (spawn): forking a process that holds vLLM's and torch's
    threads is not safe. Each imports vLLM once and re-runs many candidates."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_quiet_worker)


def _emit(result: Result, trace: Path, scheduler_cls: str | None, out: Path) -> None:
    from vllm_contract.replay.query import catalog
    from vllm_contract.replay.resim.emit import pytest_file

    inv = next((i for i in catalog.load(None) if i.id == result.invariant), None)
    try:
        text = pytest_file(result.trace, result.invariant, inv.title if inv else "",
                           inv.why if inv else "", str(trace), scheduler_cls)
    except TraceError as e:
        result.no_pytest = str(e)
        return
    result.pytest_file = out / f"test_{result.invariant.replace('.', '_')}.py"
    result.pytest_file.write_text(text)


def report(r: Result, trace: Path, scheduler_cls: str | None, finding: Any) -> str:
    """The reduction's README: the finding, what was cut, how long it took."""
    from vllm_contract.replay.query import catalog

    why = next((i.why for i in catalog.load(None) if i.id == r.invariant), "") or ""
    lines = [f"# {r.invariant}: reduced", "",
             f"From `{trace}` ({_said(finding)}: {finding.title or finding.details}).", "",
             "| | requests | steps |", "|---|---|---|",
             f"| recording | {r.original_requests:,} | {r.original_steps:,} |",
             f"| reduced | {len(r.best.requests):,} | {r.best_steps:,} |", "",
             f"Requests kept: {', '.join(f'`{x}`' for x in r.best.requests)}"
             + (f"; the re-run stops after step {r.best.until:,} of the recording's clock."
                if r.best.until is not None else "."), ""]
    for rid, c in r.cuts().items():
        lines.append(f"- `{rid}` cut shorter: {c['prompt_tokens']:,} of its "
                     f"{c['prompt_tokens_recorded']:,} prompt tokens (the first), "
                     f"{c['outputs']:,} of its {c['outputs_recorded']:,} outputs (max_tokens)")
    for k, v in r.settings().items():
        lines.append(f"- `{k}` {v['value']:,} (recorded {v['recorded']:,})")
    if r.cuts() or r.settings():
        lines.append("")
    lines += [f"Scheduler: `{scheduler_cls or 'the installed vLLM Scheduler'}`. "
              f"{r.calls:,} re-simulations, {r.seconds:.1f} s"
              + (f" (stopped early: {r.stopped}; the best so far)." if r.stopped else "."), "",
              "The reduced recording (`trace/`) is the scheduler's re-run of those requests, "
              "recorded; `vllm-contract check trace`, `tui`, `replay` and `resim` open it. "
              "Its findings:", ""]
    lines += [f"- {_said(f)}: {f.title or f.details}" for f in r.findings] or ["- none"]
    if r.pytest_file is not None:
        lines += ["", f"`{r.pytest_file.name}` is a standalone test of the contract (vLLM and "
                  "pytest only): it fails with the scheduler above and passes once the bug is "
                  "fixed; `VLLM_SCHEDULER_CLS=module:Class pytest "
                  f"{r.pytest_file.name}` picks the scheduler (default vLLM's own)."]
    else:
        lines += ["", f"No pytest file: {r.no_pytest}."]
    if why:
        lines += ["", "Why it matters:", "", why.strip()]
    return "\n".join(lines) + "\n"
