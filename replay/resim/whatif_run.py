"""The what-if run (docs/resim.md, "What-if runs"): `WhatIf`, the stepping core run on its
own schedule until every request has finished, and `Driver`, its loop over the scheduler;
the comparison with the recording is whatif.py's."""

from __future__ import annotations

import bdb
from typing import Any, Iterator

from vllm_contract.replay.resim import record
from vllm_contract.replay.resim.core import ResimRun, StepResult, in_words, mask
from vllm_contract.replay.resim.feed import FILLER, runner_output
from vllm_contract.replay.resim.whatif import (Comparison, Facts, abort_steps, measure,
                                               recorded_side)
from vllm_contract.replay.resim.words import first_difference

# a re-run that keeps scheduling without draining (preemption thrash) is cut off at this many
# times the recording's steps, plus a margin for a small recording
_LIMIT_FACTOR, _LIMIT_MARGIN = 20, 1000


class WhatIf(ResimRun):
    """The re-run's own steps, each compared with the recording's step of the same index
    while the recording has one; the summary's `whatif` compares the two in aggregate."""

    def _steps(self) -> Iterator[StepResult]:
        self.inputs.outputs.load_all()  # any request's whole stream, at any step
        driver = Driver(self)
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
                    rec, plain = mask(rec), mask(plain)
                yield self._count(in_words(step, first_difference(rec, plain)))
        except bdb.BdbQuit:
            self.summary_.quit_at = step
        except Exception as e:  # the re-run's scheduler broke: the measures up to there
            if self._in_hook:
                raise
            yield self._count(StepResult(
                -1 if step is None else step + 1, False, f"the re-run's scheduler raised "
                f"{type(e).__name__}: {' '.join(str(e).split())}", None, "exception"))
            self.summary_.stopped = True
        self.summary_.until = self.options.until
        self.summary_.whatif = Comparison(recorded_side(self.inputs),
                                          measure(driver.facts, driver.added), driver.notes)

    def _checked(self) -> None:
        if self.summary_.whatif is not None and self.options.check_recording:
            original = record.check(record.Recorded(self.source.get("trace", "")))
            self.summary_.whatif.recording.update(_findings(original))
            self.summary_.whatif.rerun.update(_findings(self.summary_.recorded))


def _findings(rec: record.Recorded) -> dict:
    return {"errors": rec.errors, "warnings": rec.warnings, "findings": rec.findings}


class Driver:
    """The what-if loop over a run's scheduler, through the run's public face (core.ResimRun):
    arrivals at the recording's step index, aborts before the step the recording fed them
    before, one batch in flight, every request run until it finishes or has used all its
    recorded outputs."""

    def __init__(self, rs: ResimRun) -> None:
        self.rs, self.sched, self.inputs = rs, rs.scheduler, rs.inputs
        self.aborts = abort_steps(rs.inputs)
        added = rs.inputs.added
        keep = rs.options.keep
        if keep is not None:  # some of the requests (reduce.py): the others never come
            self.aborts = {s: kept for s, calls in self.aborts.items()
                           if (kept := [c for c in calls if c.req_id in keep])}
        if added is not None:  # the input log: each add where it came (or by its time)
            times = []
            if rs.options.arrivals == "time":
                t = rs.engine.read("steps", ["step", "t_ns"]).to_pylist()
                times = [r["t_ns"] for r in sorted(t, key=lambda r: r["step"])]
            first = min(rs.inputs.plains)
            self.arrivals: dict[int, Any] = {}
            for k, seqs in sorted(added.arrival_steps(rs.options.arrivals, times).items()):
                if keep is not None:
                    seqs = [q for q in seqs if added.req_id(q) in keep]
                if seqs:
                    self.arrivals.setdefault(max(k, first), []).extend(seqs)
        else:
            # the steps that introduce a request: their canonical form is made when reached
            self.arrivals = dict.fromkeys(
                sorted({s for steps in rs.inputs.intro.values() for s in steps}))
        self.queue: list[tuple[int, Any]] = []  # (step, Request) not added yet
        self.facts: list[Facts] = []
        self.added: list[tuple[int, str]] = []
        self.statuses = _abort_statuses(rs.inputs)
        self.notes: list[str] = []

    def _events_after(self, step: int) -> list[int]:
        return [s for s in list(self.arrivals) + list(self.aborts) if s > step]

    def _feed(self, step: int) -> None:
        """The aborts and arrivals due before `step`'s schedule(); with an input log in their
        recorded order (an abort and a re-add of its id at one step), else aborts first."""
        if self.inputs.added is None:
            for call in self.aborts.pop(step, []):
                self._abort(call)
            self._arrive(step)
        else:
            due = [(seq, None) for seq in self.arrivals.pop(step, [])]
            due += [(c.data, c) for c in self.aborts.pop(step, [])]
            for seq, call in sorted(due, key=lambda d: d[0]):
                if call is not None:
                    self._abort(call)
                    continue
                self.queue.append((step, self.rs.logged_request(seq)))
        self._admit(step)

    def _arrive(self, step: int) -> None:
        """Derived inputs: the requests the recording introduced at `step`, rebuilt."""
        if step in self.arrivals:
            del self.arrivals[step]
            plain = self.inputs.plains[step]
            for nr in self.rs.rebuilt.build_step(step, plain).scheduled_new_reqs:
                if self.rs.redacted:
                    nr.prompt_token_ids = [FILLER] * self.rs.prompt_len(step, nr.req_id)
                self.queue.append((step, self.rs.requests.from_new(nr)))

    def _admit(self, step: int) -> None:
        waiting, self.queue = self.queue, []
        blocked: set[str] = set()
        for s, req in waiting:  # a reused id waits for its earlier request to finish
            if req.request_id in self.sched.requests or req.request_id in blocked:
                blocked.add(req.request_id)
                self.queue.append((s, req))
            else:
                self.sched.add_request(req)
                self.added.append((step, req.request_id))

    def _abort(self, call: Any) -> None:
        from vllm.v1.request import RequestStatus

        queued = [q for q in self.queue if q[1].request_id == call.req_id]
        if queued:  # never added in the re-run: it ends unscheduled
            self.queue.remove(queued[0])
            return
        if call.req_id not in self.sched.requests:
            # finished already, never scheduled in the recording either, or (arrivals by
            # time) not arrived yet: then it never does
            self._cancel(call)
            return
        status = RequestStatus.__members__.get(call.status or "")
        if status is None or not RequestStatus.is_finished(status):
            status = RequestStatus.FINISHED_ABORTED
        self.sched.finish_requests(call.req_id, status)
        if self.facts:
            self.facts[-1].ended.append(call.req_id)

    def _cancel(self, call: Any) -> None:
        """An abort of an add still to come (arrivals by time): that add is not made."""
        added = self.inputs.added
        if added is None:
            return
        for step, seqs in list(self.arrivals.items()):
            for seq in seqs:
                if seq < call.data and added.req_id(seq) == call.req_id:
                    seqs.remove(seq)
                    if not seqs:
                        del self.arrivals[step]
                    return

    def steps(self) -> Iterator[tuple[int, dict]]:
        """(step, the re-run's canonical SchedulerOutput) for each step run."""
        plains = self.inputs.plains
        step, limit = min(plains), min(plains) + _LIMIT_FACTOR * len(plains) + _LIMIT_MARGIN
        empty = 0
        while True:
            self._feed(step)
            # as EngineCore's loop: a step more while finished ids wait to be delivered
            if not self.sched.has_requests() and not self.queue:
                later = self._events_after(step)
                if not later:
                    return
                step = min(later)  # idle until the next arrival: steps not run
                continue
            if step == self.rs.options.break_at:  # the requests are added already
                self.rs.stop_at(step, [])
            plain = self._one(step)
            yield step, plain
            empty = 0 if plain["num_scheduled_tokens"] else empty + 1
            if empty >= 2 and not self._events_after(step):
                self.notes.append(f"the re-run's scheduler scheduled nothing at step {step:,} "
                                  f"with {self.sched.get_num_unfinished_requests():,} request(s) "
                                  "left (one that never fits the KV cache?): stopped there")
                return
            until = self.rs.options.until
            if until is not None and step >= until:
                return
            if step >= limit:
                self.notes.append(f"the re-run had not drained after step {step:,}: stopped")
                return
            step += 1

    def _one(self, step: int) -> dict:
        from vllm_contract.replay.resim.feed import finishes_of
        from vllm_contract.replay.worker.canonical import from_live

        so = self.sched.schedule()
        plain = from_live(so)
        reqs = self.sched.requests
        chunks = {rid: reqs[rid].is_prefill_chunk for rid in so.num_scheduled_tokens
                  if rid in reqs}
        if so.has_structured_output_requests:
            self.sched.get_grammar_bitmask(so)
        mro = self._model_output(so, chunks)
        outs = self.sched.update_from_output(so, mro)
        f = Facts(step, plain, {r for r, t in zip(mro.req_ids, mro.sampled_token_ids) if t},
                  [rid for rid, _ in finishes_of(outs)])
        f.ended += self._cap(mro.req_ids)
        self.facts.append(f)
        return plain

    def _stream(self, req: Any) -> list[int]:
        key = self.rs.requests.key(req)
        return [] if key is None else self.inputs.outputs.streams.get(key, [])

    def _model_output(self, so: Any, chunks: dict[str, bool]) -> Any:
        """One token a request: its recorded one at its output position (drafts are not
        given in a what-if run, so a step never accepts several)."""
        def recorded(rid: str) -> list[int]:
            req = self.sched.requests[rid]
            stream, pos = self._stream(req), req.num_output_tokens
            return [stream[pos] if pos < len(stream) else FILLER]

        return runner_output(so, chunks, recorded)

    def _cap(self, req_ids: list[str]) -> list[str]:
        """Finish the requests that have used all their recorded outputs and that the
        scheduler did not finish itself, with the recording's finish status."""
        from vllm.v1.request import RequestStatus

        ended = []
        for rid in req_ids:
            req = self.sched.requests.get(rid)
            if req is None or req.is_finished() or req.num_output_tokens < max(
                    1, len(self._stream(req))):
                continue
            key = self.rs.requests.key(req)
            name = self.statuses.get(key, "FINISHED_ABORTED")
            status = RequestStatus.__members__.get(name, RequestStatus.FINISHED_ABORTED)
            if not RequestStatus.is_finished(status):
                status = RequestStatus.FINISHED_ABORTED
            self.sched.finish_requests(rid, status)
            ended.append(rid)
        return ended


def _abort_statuses(inputs) -> dict[tuple[str, int], str]:
    """(req_id, incarnation) -> the status the recording aborted it with."""
    intro = inputs.intro
    out = {}
    for c in inputs.calls:
        if c.kind == "abort" and c.status:
            if inputs.added is not None:  # incarnations are adds (log.py)
                k = inputs.added.incarnation_at(c.req_id, c.data)
            else:
                k = sum(1 for s in intro.get(c.req_id, []) if s <= c.step) - 1
            if k >= 0:
                out[(c.req_id, k)] = c.status
    return out
