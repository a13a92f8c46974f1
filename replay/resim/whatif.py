"""What-if runs (docs/resim.md, "What-if runs"): the re-run with other settings or another
scheduler class runs on its own schedule until every request has finished, and is compared
with the recording in aggregate (steps to drain, preemptions, tokens per step, waiting, time
to first token, peak KV blocks held) instead of step by step. The measures are one function
(`measure`) of the canonical SchedulerOutputs, fed the recording's rows on one side and the
re-run's live outputs on the other, so both sides are counted the same way."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator

from vllm_contract.replay.resim.feed import FILLER

# a re-run that keeps scheduling without draining (preemption thrash) is cut off at this many
# times the recording's steps, plus a margin for a small recording
_LIMIT_FACTOR, _LIMIT_MARGIN = 20, 1000


@dataclass
class Facts:
    """One step as the measures read it: the canonical SchedulerOutput, the requests its
    update gave a token, and the requests that ended after it (its update's finishes, and
    the aborts fed before the next step)."""
    step: int
    plain: dict
    sampled: set[str] = field(default_factory=set)
    ended: list[str] = field(default_factory=list)


def percentile(values: list[int], q: float) -> int | None:
    """Nearest rank: the smallest value with at least q % of the values at or below it."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s) / 100) - 1)]


def _blocks(ids: Any) -> list[tuple[int, int]]:
    # block 0 is vLLM's null block (a sliding window's dropped blocks point at it): not held
    return [(g, b) for g, group in enumerate(ids or []) for b in (group or []) if b]


class _Held:
    """Distinct KV blocks referenced by the block tables sent to the worker, per request."""

    def __init__(self) -> None:
        self.tables: dict[str, list[tuple[int, int]]] = {}
        self.refs: dict[tuple[int, int], int] = defaultdict(int)

    def drop(self, rid: str) -> None:
        for b in self.tables.pop(rid, []):
            self.refs[b] -= 1
            if not self.refs[b]:
                del self.refs[b]

    def add(self, rid: str, blocks: list[tuple[int, int]]) -> None:
        self.tables.setdefault(rid, []).extend(blocks)
        for b in blocks:
            self.refs[b] += 1

    def step(self, plain: dict) -> int:
        for rid in (plain.get("finished_req_ids") or []) + (plain.get("preempted_req_ids") or []):
            self.drop(rid)
        for r in plain["scheduled_new_reqs"]:
            self.drop(r["req_id"])
            self.add(r["req_id"], _blocks(r.get("block_ids")))
        c = plain["scheduled_cached_reqs"]
        resumed = set(c.get("resumed_req_ids") or [])
        for rid, ids in zip(c["req_ids"], c["new_block_ids"]):
            if rid in resumed:  # a resumed request's table is sent whole
                self.drop(rid)
            self.add(rid, _blocks(ids))
        return len(self.refs)


def measure(facts: list[Facts], arrivals: list[tuple[int, str]]) -> dict:
    """The comparison's numbers for one side. `arrivals`: (step, req_id) of each request
    incarnation, at the step it was added."""
    arriving: dict[int, list[str]] = defaultdict(list)
    for s, rid in arrivals:
        arriving[s].append(rid)
    live: dict[str, dict] = {}
    done: list[dict] = []
    held, peak, preemptions, tokens = _Held(), 0, 0, []
    for f in facts:
        for rid in arriving.pop(f.step, []):
            if rid in live:  # a reused id whose earlier request's end the side never said
                done.append(live.pop(rid))
            live[rid] = {"arrival": f.step, "waited": 0, "first": None}
        nst = f.plain["num_scheduled_tokens"]
        tokens.append(sum(nst.values()))
        preemptions += len(f.plain.get("preempted_req_ids") or [])
        for rid, r in live.items():
            if rid not in nst:
                r["waited"] += 1
            elif r["first"] is None and rid in f.sampled:
                r["first"] = f.step
        peak = max(peak, held.step(f.plain))
        for rid in f.ended:
            if rid in live:
                done.append(live.pop(rid))
    done.extend(live.values())
    waits = [r["waited"] for r in done]
    ttft = [r["first"] - r["arrival"] + 1 for r in done if r["first"] is not None]
    busy = [f.step for f in facts if f.plain["num_scheduled_tokens"]]
    # to the last step that scheduled a token: a recording's last step often only delivers
    # finished ids, which a re-run that stops once nothing is left does not make
    return {"steps_to_drain": busy[-1] - facts[0].step + 1 if busy else 0,
            "requests": len(done), "preemptions": preemptions,
            "tokens_per_step_p50": percentile(tokens, 50),
            "tokens_per_step_p95": percentile(tokens, 95),
            "waiting_steps_p50": percentile(waits, 50), "waiting_steps_p99": percentile(waits, 99),
            "ttft_steps_p50": percentile(ttft, 50), "ttft_steps_p99": percentile(ttft, 99),
            "peak_kv_blocks": peak}


def abort_steps(inputs) -> dict[int, list]:
    """Each recorded abort, keyed by the step whose schedule() the recording made next (one
    past the last step for the aborts after it)."""
    out: dict[int, list] = defaultdict(list)
    later = []
    for call in inputs.calls:
        if call.kind == "abort":
            later.append(call)
        elif call.kind == "schedule":
            if later:
                out[call.step].extend(later)
            later = []
    if later:
        out[max(inputs.plains) + 1].extend(later)
    return out


def recorded_side(inputs) -> dict:
    """The recording's measures, from its canonical SchedulerOutputs and model outputs."""
    given: dict[int, set[str]] = defaultdict(set)
    for (step, rid), toks in inputs.outputs.by_step.items():
        if toks:
            given[step].add(rid)
    aborted = abort_steps(inputs)
    facts, arrivals = [], []
    if inputs.added is not None:  # where each request was added: it waited from there
        first = min(inputs.plains)
        t = inputs.added.table
        arrivals = [(max(first, s + 1), rid) for s, rid in zip(t["step"].to_pylist(),
                                                               t["req_id"].to_pylist())]
    for s in sorted(inputs.plains):
        plain = inputs.plains[s]
        if inputs.added is None:  # derived: a request arrives where it is first scheduled
            arrivals += [(s, r["req_id"]) for r in plain["scheduled_new_reqs"]]
        ended = [rid for rid, _ in inputs.finishes.get(s, [])]
        ended += [c.req_id for c in aborted.get(s + 1, [])]
        facts.append(Facts(s, plain, given[s], ended))
    return measure(facts, arrivals)


@dataclass
class Comparison:
    recording: dict
    rerun: dict
    notes: list[str] = field(default_factory=list)  # how the what-if run ended, if not drained

    def as_dict(self) -> dict:
        return {"recording": dict(self.recording), "rerun": dict(self.rerun),
                "notes": list(self.notes)}


_ROWS = [("steps to drain", ("steps_to_drain",)), ("requests", ("requests",)),
         ("preemptions", ("preemptions",)),
         ("tokens per step p50 / p95", ("tokens_per_step_p50", "tokens_per_step_p95")),
         ("waiting, steps p50 / p99", ("waiting_steps_p50", "waiting_steps_p99")),
         ("first token, steps p50 / p99", ("ttft_steps_p50", "ttft_steps_p99")),
         ("peak KV blocks held", ("peak_kv_blocks",)),
         ("catalog errors / warnings", ("errors", "warnings"))]


def table(c: Comparison) -> list[str]:
    def cell(side: dict, keys: tuple) -> str:
        if any(k not in side for k in keys):
            return "-"
        return " / ".join("-" if side[k] is None else f"{side[k]:,}" for k in keys)

    lines = [f"{'':30}{'recording':>14}{'re-run':>14}"]
    for label, keys in _ROWS:
        lines.append(f"{label:30}{cell(c.recording, keys):>14}{cell(c.rerun, keys):>14}")
    return lines + c.notes


class Driver:
    """The what-if loop over a Resim's scheduler: arrivals at the recording's step index,
    aborts before the step the recording fed them before, one batch in flight, every request
    run until it finishes or has used all its recorded outputs."""

    def __init__(self, rs) -> None:
        self.rs, self.sched, self.inputs = rs, rs.scheduler, rs.inputs
        self.aborts = abort_steps(rs.inputs)
        added = rs.inputs.added
        keep = rs.keep
        if keep is not None:  # some of the requests (reduce.py): the others never come
            self.aborts = {s: kept for s, calls in self.aborts.items()
                           if (kept := [c for c in calls if c.req_id in keep])}
        if added is not None:  # the input log: each add where it came (or by its time)
            times = []
            if rs.arrivals == "time":
                t = rs.engine.read("steps", ["step", "t_ns"]).to_pylist()
                times = [r["t_ns"] for r in sorted(t, key=lambda r: r["step"])]
            first = min(rs.inputs.plains)
            self.arrivals: dict[int, Any] = {}
            for k, seqs in sorted(added.arrival_steps(rs.arrivals, times).items()):
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
                    nr.prompt_token_ids = [FILLER] * self.rs._prompt_len(step, nr.req_id)
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
            if step == self.rs.break_at:
                self.rs._break_whatif(step)
            plain = self._one(step)
            yield step, plain
            empty = 0 if plain["num_scheduled_tokens"] else empty + 1
            if empty >= 2 and not self._events_after(step):
                self.notes.append(f"the re-run's scheduler scheduled nothing at step {step:,} "
                                  f"with {self.sched.get_num_unfinished_requests():,} request(s) "
                                  "left (one that never fits the KV cache?): stopped there")
                return
            if self.rs.until is not None and step >= self.rs.until:
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
        from vllm.v1.outputs import ModelRunnerOutput

        req_ids, sampled = [], []
        for rid in so.num_scheduled_tokens:
            if rid not in chunks:
                continue
            req_ids.append(rid)
            if chunks[rid]:
                sampled.append([])
                continue
            req = self.sched.requests[rid]
            stream, pos = self._stream(req), req.num_output_tokens
            sampled.append([stream[pos] if pos < len(stream) else FILLER])
        return ModelRunnerOutput(req_ids=req_ids,
                                 req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled)

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
