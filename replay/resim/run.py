"""The strict re-run: a fresh scheduler fed the recording's derived inputs in their recorded
order, each SchedulerOutput compared with the recorded one in canonical form (canonical.py)."""

from __future__ import annotations

import bdb
from typing import Any, Iterator

from vllm_contract.replay.resim import debug
from vllm_contract.replay.resim.core import ResimRun, Setup, StepResult, in_words, mask
from vllm_contract.replay.resim.inputs import Call
from vllm_contract.replay.resim.options import ResimOptions
from vllm_contract.replay.resim.words import finish_difference, first_difference


class Resim(ResimRun):
    """One StepResult per recorded step, in step order as their updates come."""

    def __init__(self, setup: Setup, options: ResimOptions) -> None:
        super().__init__(setup, options)
        inputs = setup.inputs
        # sync speculative decoding: the worker's drafts come back through the scheduler
        # (an input log has them: given as recorded)
        self.drafts = (bool(self.built.settings.get("speculative")) and inputs.in_flight <= 1
                       and not inputs.logged)
        self._queue: list[Call] = []  # an input log's calls since the last schedule/update
        self._args: tuple[list, dict] = ([], {})  # schedule()'s, as last logged
        self._pending: dict[int, list] = {}

    def _steps(self) -> Iterator[StepResult]:
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
        until = self.options.until
        for step in sorted(self._pending):  # batches never updated in the recording
            so, chunks, diff = self._pending.pop(step)
            if until is None or step <= until:
                yield self._count(in_words(step, diff))
        self.summary_.until = until

    def _until_reached(self, step: int) -> bool:
        """Every step up to --until has its result; steps scheduled past it (batches in
        flight) are left unanswered."""
        until = self.options.until
        return (until is not None and step >= until
                and all(s > until for s in self._pending))

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
                    nr.prompt_token_ids = [3] * self.prompt_len(step, nr.req_id)
                new.append(self.requests.from_new(nr))
        if step == self.options.break_at:
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
            rec, run = mask(rec), mask(run)
        self._pending[step] = [so, chunks, first_difference(rec, run)]

    def _schedule_logged(self, step: int, plain: dict) -> None:
        """An input log's step: the calls logged since the last one (the break hook sees
        them first), then schedule() with its logged arguments."""
        pending = self._pending_calls()
        if step == self.options.break_at:
            pending = self.stop_at(step, pending)
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
        left = self.stop_at(step, [debug.Pending("add_request", r) for r in new])
        return [p.request for p in left if p.call == "add_request"]

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
        return in_words(step, diff)

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
