"""The shadow worker: a pure-Python model of the state vLLM's worker keeps (GPUModelRunner's
`_update_states`, the persistent batch of gpu_input_batch.py, `_gather_mm_embeddings`' encoder
reads), applied to a recorded trace one SchedulerOutput at a time. It reports, as findings in
`check`'s format (ids `worker.*`), where a real worker would raise or silently compute the
wrong thing. What it models and what it does not: docs/replay-shadow.md.

pyarrow only: no vLLM, no DuckDB.
"""

from __future__ import annotations

import copy
from bisect import bisect_right
from typing import Callable

import pyarrow as pa

from vllm_contract.findings import Finding

# id -> (severity, title); all errors: each is a crash or silently wrong KV / tokens
FINDINGS = {
    "worker.unknown_cached": (
        "error", "a cached request the worker does not hold (KeyError in _update_states)"),
    "worker.unknown_scheduled": (
        "error", "tokens scheduled for a request the worker does not hold in its batch"),
    "worker.resumed_without_table": (
        "error", "a resumed request without a whole block table"),
    "worker.stale_table_append": (
        "error", "new blocks appended to the stale table of a preempted request"),
    "worker.encoder_output_missing": (
        "error", "an encoder output the worker must read is no longer cached"),
    "worker.block_shared": (
        "error", "a block given to a request while another live request holds it"),
    "worker.output_order": (
        "error", "the model output's request ids differ from the worker's persistent batch"),
    "worker.never_freed": (
        "error", "a finished request's state is never freed in the worker"),
}
# the catalog's check that says the same thing at the same (step, req_id): `check --worker
# shadow` keeps only the catalog's finding there
SAME_AS = {
    "worker.unknown_cached": "lifecycle.unknown_cached",
    "worker.unknown_scheduled": "tokens.unlisted_request",
    "worker.resumed_without_table": "lifecycle.resumed_without_blocks",
    "worker.stale_table_append": "lifecycle.preempted_not_resumed",
    "worker.encoder_output_missing": "encoder.freed_while_needed",
    "worker.block_shared": "blocks.double_owner",
    "worker.output_order": "outputs.ids_mismatch",
    "worker.never_freed": "finished.leaked",
}

_COLUMNS = {
    "steps": ["step", "t_ns"],
    "scheduled": ["step", "req_id", "kind", "pos", "num_scheduled_tokens",
                  "num_computed_tokens", "num_output_tokens", "new_block_ids", "encoder_inputs"],
    "requests": ["step", "req_id", "pos", "prompt_len"],
    "mm_inputs": ["step", "req_id", "pos", "identifier", "offset", "length"],
    "finished": ["step", "req_id"],
    "preempted": ["step", "req_id"],
    "freed_mm": ["step", "pos", "mm_hash"],
    "model_outputs": ["step", "req_id", "pos"],
    "finish_events": ["step", "req_id", "t_ns"],
    "updates": ["step"],
}


class _Table:
    """A table's columns as Python lists, sorted by step (then pos), with each step's row
    range: no per-row dicts."""

    def __init__(self, table: pa.Table) -> None:
        keys = [("step", "ascending")]
        if "pos" in table.column_names:
            keys.append(("pos", "ascending"))
        table = table.sort_by(keys)
        self.cols = {c: table.column(c).to_pylist() for c in table.column_names}
        self.ranges: dict[int, tuple[int, int]] = {}
        steps = self.cols["step"]
        lo = 0
        for i in range(1, len(steps) + 1):
            if i == len(steps) or steps[i] != steps[lo]:
                if steps:
                    self.ranges[steps[lo]] = (lo, i)
                lo = i

    def rows(self, step: int) -> range:
        lo, hi = self.ranges.get(step, (0, 0))
        return range(lo, hi)


class Req:
    """What the worker caches for one request (CachedRequestState, the parts the contract
    governs)."""

    __slots__ = ("req_id", "prompt_len", "num_computed", "num_output", "blocks", "mm",
                 "intro_step", "preempted", "adopted")

    def __init__(self, req_id, prompt_len, num_computed, blocks, mm, intro_step, adopted=False):
        self.req_id = req_id
        self.prompt_len = prompt_len
        self.num_computed = num_computed
        self.num_output = 0
        self.blocks = blocks  # list per KV cache group
        self.mm = mm  # [(identifier, offset, length)] in mm_features order
        self.intro_step = intro_step
        self.preempted = False  # preempted since its table was last set whole
        self.adopted = adopted  # taken as held without seeing it introduced

    def plain(self) -> dict:
        return {"req_id": self.req_id, "prompt_len": self.prompt_len,
                "num_computed_tokens": self.num_computed, "num_output_tokens": self.num_output,
                "block_ids": [list(g) for g in self.blocks],
                "mm_features": [{"identifier": i, "offset": o, "length": n}
                                for i, o, n in self.mm],
                "introduced_at": self.intro_step, "preempted": self.preempted,
                "adopted": self.adopted}


class _State:
    """Everything that changes per step; copied whole for a checkpoint."""

    def __init__(self) -> None:
        self.pos = 0  # index into the engine's steps of the next step to apply
        self.requests: dict[str, Req] = {}
        self.slots: list[str | None] = []  # the persistent batch, in order
        self.encoder: dict[str, int] = {}  # identifier -> step it was cached at
        self.ever_encoded: set[str] = set()
        self.holders: dict[tuple[int, int], set[str]] = {}  # (group, block) -> req ids
        self.released_events = 0  # finish events whose blocks were released
        self.findings: list[Finding] = []
        self.flagged: set[str] = set()  # ids already reported unknown (once per instance)
        self.known: set[str] = set()  # ids introduced, adopted or freed so far


class ShadowWorker:
    """The shadow worker over one engine of a trace. `step()` applies the next recorded step;
    `finish()` adds what only the end of the trace tells (state never freed)."""

    def __init__(self, engine, strict_order: bool = False, checkpoint_every: int = 256) -> None:
        self.engine = engine.name
        m = engine.manifest
        self.block_size = (m.get("engine") or {}).get("block_size")
        self.mid_stream = bool(m.get("attached_mid_stream"))
        self.strict_order = strict_order
        self.checkpoint_every = max(1, checkpoint_every)
        t = {name: _Table(engine.read(name, cols)) for name, cols in _COLUMNS.items()}
        self._t = t
        self.steps: list[int] = sorted(t["steps"].ranges)
        self._t_ns = {s: t["steps"].cols["t_ns"][t["steps"].ranges[s][0]] for s in self.steps}
        self._updated = set(t["updates"].ranges)
        ev = t["finish_events"].cols
        # finish events in step order: the scheduler frees the blocks at the event, so from
        # the next step on they may belong to someone else
        self._events = sorted(zip(ev["step"], ev["req_id"], ev["t_ns"]),
                              key=lambda e: (e[0], e[2] or 0))
        self._event_steps = [e[0] for e in self._events]
        self.s = _State()
        self._checkpoints: dict[int, _State] = {0: copy.deepcopy(self.s)}
        self._finished = False

    # -- stepping ---------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.s.pos >= len(self.steps)

    @property
    def findings(self) -> list[Finding]:
        return self.s.findings

    def run(self, until: int | None = None, progress: Callable[[int, int], None] | None = None,
            cancel: Callable[[], bool] | None = None) -> bool:
        """Apply steps up to index `until` (exclusive; default all, then finish()); False if
        cancelled."""
        end = len(self.steps) if until is None else min(until, len(self.steps))
        total = end
        while self.s.pos < end:
            if cancel is not None and self.s.pos % 64 == 0 and cancel():
                return False
            self.step()
            if progress is not None and (self.s.pos % 256 == 0 or self.s.pos == end):
                progress(self.s.pos, total)
        if until is None:
            self.finish()
        return True

    def goto(self, pos: int) -> None:
        """State before step index `pos`: the nearest checkpoint at or below it, then replay."""
        pos = max(0, min(pos, len(self.steps)))
        if pos < self.s.pos or self._finished:
            base = max(k for k in self._checkpoints if k <= pos)
            self.s = copy.deepcopy(self._checkpoints[base])
            self._finished = False
        while self.s.pos < pos:
            self.step()

    def _report(self, inv: str, step: int, req_id: str | None, details: str) -> None:
        sev, title = FINDINGS[inv]
        self.s.findings.append(Finding(invariant=inv, severity=sev, step=step, req_id=req_id,
                                       message=f"{title}: {details}", engine=self.engine,
                                       title=title))

    def step(self) -> list[Finding]:
        """Apply the next recorded step, in _update_states' order; returns its findings."""
        s, t = self.s, self._t
        step = self.steps[s.pos]
        before = len(s.findings)
        sc = t["scheduled"].cols
        rows = t["scheduled"].rows(step)
        nst: dict[str, int] = {}
        new_rows, cached_rows, enc_rows = [], [], []
        for i in rows:
            kind = sc["kind"][i]
            if kind == "new":
                new_rows.append(i)
            elif kind in ("cached", "resumed"):
                cached_rows.append(i)
            if sc["num_scheduled_tokens"][i] is not None:
                nst[sc["req_id"][i]] = sc["num_scheduled_tokens"][i]
            if sc["encoder_inputs"][i]:
                enc_rows.append(i)
        resumed = {sc["req_id"][i] for i in cached_rows if sc["kind"][i] == "resumed"}

        # finished ids first: state popped, batch slot freed (unknown ids tolerated)
        fc = t["finished"].cols
        for i in t["finished"].rows(step):
            rid = fc["req_id"][i]
            req = s.requests.pop(rid, None)
            s.flagged.discard(rid)
            s.known.add(rid)
            if req is not None:
                self._release(rid, req)
            self._remove(rid)
        # encoder outputs freed
        fm = t["freed_mm"].cols
        for i in t["freed_mm"].rows(step):
            s.encoder.pop(fm["mm_hash"][i], None)
        # blocks the scheduler took back: preempted in this step, finished before it
        pc = t["preempted"].cols
        for i in t["preempted"].rows(step):
            req = s.requests.get(pc["req_id"][i])
            if req is not None:
                req.preempted = True
                self._release(req.req_id, req)
        upto = bisect_right(self._event_steps, step - 1)
        while s.released_events < upto:
            rid = self._events[s.released_events][1]
            req = s.requests.get(rid)
            if req is not None:
                self._release(rid, req)
            s.released_events += 1
        # unscheduled requests leave the batch, their state kept
        stay = set(nst) - resumed
        for rid in [r for r in s.slots if r is not None and r not in stay]:
            self._remove(rid)

        in_batch = {r for r in s.slots if r is not None}
        to_add: list[str] = []
        acquired: list[tuple[str, str, list, int]] = []  # (rid, kind, new blocks, computed)
        rq, mm = t["requests"].cols, t["mm_inputs"].cols
        prompt_len = {rq["req_id"][i]: rq["prompt_len"][i] for i in t["requests"].rows(step)}
        feats: dict[str, list] = {}
        for i in t["mm_inputs"].rows(step):
            feats.setdefault(mm["req_id"][i], []).append(
                (mm["identifier"][i], mm["offset"][i], mm["length"][i]))
        for i in new_rows:
            rid = sc["req_id"][i]
            blocks = [list(g) for g in (sc["new_block_ids"][i] or [])]
            req = Req(rid, prompt_len.get(rid), sc["num_computed_tokens"][i] or 0, blocks,
                      feats.get(rid, []), step)
            old = s.requests.get(rid)
            if old is not None:  # a streaming update in vLLM; the catalog judges reuse
                self._release(rid, old)
            s.requests[rid] = req
            s.flagged.discard(rid)
            s.known.add(rid)
            if rid not in in_batch:
                to_add.append(rid)
            acquired.append((rid, "new", blocks, req.num_computed))

        for i in cached_rows:
            rid = sc["req_id"][i]
            is_resumed = rid in resumed
            nb = sc["new_block_ids"][i]
            computed = sc["num_computed_tokens"][i] or 0
            req = s.requests.get(rid)
            if req is None:
                # a trace attached to a running engine starts with requests already held
                if not (self.mid_stream and rid not in s.known):
                    if rid not in s.flagged:
                        self._report("worker.unknown_cached", step, rid,
                                     "never introduced as new, or already freed")
                    s.flagged.add(rid)
                req = Req(rid, None, computed, [], [], step, adopted=True)
                s.requests[rid] = req
                s.known.add(rid)
                if not is_resumed:
                    # adopted: what the trace tells is only the blocks it appends now
                    req.blocks = [list(g) for g in (nb or [])]
                    nb = None
            if is_resumed:
                if rid in in_batch:
                    self._report("worker.resumed_without_table", step, rid,
                                 "resumed while still in the persistent batch")
                elif nb is None:
                    self._report("worker.resumed_without_table", step, rid,
                                 "resumed with new_block_ids None: nothing to replace the "
                                 "stale table with")
                else:
                    short = self._short(nb, computed + nst.get(rid, 0))
                    if short:
                        self._report("worker.resumed_without_table", step, rid, short)
                if nb is not None:
                    req.blocks = [list(g) for g in nb]
                    acquired.append((rid, "resumed", req.blocks, computed))
                req.preempted = False
            else:
                if req.preempted:
                    self._report("worker.stale_table_append", step, rid,
                                 "preempted earlier and not in resumed_req_ids: the worker "
                                 "appends to the table whose blocks were freed")
                    req.preempted = False
                if nb is not None:
                    for g, add in enumerate(nb):
                        while len(req.blocks) <= g:
                            req.blocks.append([])
                        req.blocks[g].extend(add)
                    acquired.append((rid, "cached", nb, computed))
            req.num_computed = computed
            nout = sc["num_output_tokens"][i]
            if nout is not None:
                req.num_output = nout
            if rid not in in_batch:
                to_add.append(rid)
        self._acquire(step, acquired)

        # new and re-entering requests fill the smallest free slots, then the batch condenses
        holes = sorted(i for i, r in enumerate(s.slots) if r is None)
        for rid in to_add:
            if holes:
                s.slots[holes.pop(0)] = rid
            else:
                s.slots.append(rid)
        self._condense()

        self._encoder(step, enc_rows, nst)
        batch = [r for r in s.slots if r is not None]
        members = set(batch)
        for rid in nst:
            if rid not in members:
                self._report("worker.unknown_scheduled", step, rid,
                             f"{nst[rid]} token(s) scheduled; the worker computes none")
        self._outputs(step, batch, nst)
        s.pos += 1
        if s.pos % self.checkpoint_every == 0 and s.pos not in self._checkpoints:
            self._checkpoints[s.pos] = copy.deepcopy(s)
        return s.findings[before:]

    # -- the parts of a step ----------------------------------------------------------------
    def _remove(self, rid: str) -> None:
        s = self.s
        for i, r in enumerate(s.slots):
            if r == rid:
                s.slots[i] = None
                return

    def _condense(self) -> None:
        """InputBatch.condense(): the last request moves into the smallest hole, repeatedly;
        trailing holes are cut."""
        s = self.s
        holes = sorted(i for i, r in enumerate(s.slots) if r is None)
        last = len(s.slots) - 1
        while holes:
            while last >= 0 and s.slots[last] is None:
                last -= 1
            if holes[0] >= last:
                break
            h = holes.pop(0)
            s.slots[h], s.slots[last] = s.slots[last], None
            last -= 1
        while s.slots and s.slots[-1] is None:
            s.slots.pop()

    def _short(self, table: list, need: int) -> str | None:
        """Why a resumed table cannot be whole: it must cover computed plus scheduled tokens
        (allocate_slots' promise). Judged only with one KV cache group and a known block size."""
        if not self.block_size or len(table) != 1:
            return None
        have = len(table[0]) * self.block_size
        if have >= need:
            return None
        return (f"{len(table[0])} block(s) cover {have} tokens; computed plus scheduled "
                f"tokens need {need}")

    def _release(self, rid: str, req: Req) -> None:
        holders = self.s.holders
        for g, blocks in enumerate(req.blocks):
            for b in blocks:
                h = holders.get((g, b))
                if h is not None:
                    h.discard(rid)
                    if not h:
                        del holders[(g, b)]

    def _acquire(self, step: int, acquired: list) -> None:
        """Blocks handed out this step, in the scheduler's order (running requests, then new
        ones in list order, then resumed: a resumed and a new request are not compared, their
        order in a step is unknown). Prefix-cache hits may share as many blocks as a new or
        resumed request's computed tokens cover, also blocks filled in this very step."""
        holders = self.s.holders
        order = {"cached": 0, "new": 1, "resumed": 2}
        this_step: dict[str, str] = {}
        for rid, kind, blocks, computed in sorted(acquired, key=lambda a: order[a[1]]):
            prefix = (computed // self.block_size) if self.block_size else None
            shared_by_group: dict[int, int] = {}
            example = None
            for g, group in enumerate(blocks):
                for b in group:
                    if b == 0:  # the null block: a placeholder many tables carry
                        continue
                    others = {h for h in holders.get((g, b), ()) if h != rid
                              and not ({kind, this_step.get(h)} == {"new", "resumed"})}
                    if others:
                        shared_by_group[g] = shared_by_group.get(g, 0) + 1
                        example = example or (b, min(others))
            if example is not None:
                worst = max(shared_by_group.values())
                if kind == "cached" or (prefix is not None and worst > prefix):
                    allowed = 0 if kind == "cached" else prefix
                    self._report("worker.block_shared", step, rid,
                                 f"{worst} block(s) (e.g. {example[0]}) still held by "
                                 f"{example[1]}; prefix hits cover {allowed}")
            for g, group in enumerate(blocks):
                for b in group:
                    holders.setdefault((g, b), set()).add(rid)
            this_step[rid] = kind

    def _encoder(self, step: int, enc_rows: list[int], nst: dict[str, int]) -> None:
        """Encoder outputs computed this step are cached; then every scheduled request reads
        each input whose placeholder overlaps its window (_gather_mm_embeddings)."""
        s, sc = self.s, self._t["scheduled"].cols
        for i in enc_rows:
            req = s.requests.get(sc["req_id"][i])
            if req is None:
                continue
            for idx in sc["encoder_inputs"][i]:
                if 0 <= idx < len(req.mm):
                    s.encoder[req.mm[idx][0]] = step
                    s.ever_encoded.add(req.mm[idx][0])
        for rid in s.slots:
            if rid is None or rid not in nst:
                continue
            req = s.requests.get(rid)
            if req is None or not req.mm:
                continue
            start, end = req.num_computed, req.num_computed + nst[rid]
            for identifier, offset, length in req.mm:
                if offset is None or length is None or not (offset < end and
                                                            offset + length > start):
                    continue
                if offset >= end or identifier in s.encoder:
                    continue
                if self.mid_stream and identifier not in s.ever_encoded:
                    continue  # computed before the trace began, for all it tells
                self._report("worker.encoder_output_missing", step, rid,
                             f"{identifier} (placeholder tokens {offset}..{offset + length - 1})"
                             f" is read by tokens {start}..{end - 1} but is not cached")

    def _outputs(self, step: int, batch: list[str], nst: dict[str, int]) -> None:
        if step not in self._updated:
            return
        t = self._t["model_outputs"]
        ids = [t.cols["req_id"][i] for i in t.rows(step)]
        members = set(batch)
        flagged = {f.req_id for f in self.s.findings if f.step == step}
        got = set(ids)
        for rid in batch:
            if rid not in got and rid not in flagged:
                self._report("worker.output_order", step, rid,
                             "in the worker's batch, absent from the recorded model output")
        for rid in ids:
            if rid not in members and rid not in flagged:
                self._report("worker.output_order", step, rid,
                             "in the recorded model output, not in the worker's batch")
        if self.strict_order and got == members and ids != batch:
            k = next(i for i, (a, b) in enumerate(zip(ids, batch)) if a != b)
            self._report("worker.output_order", step, ids[k],
                         f"recorded at index {k}, the persistent batch has {batch[k]} there")

    def finish(self) -> list[Finding]:
        """At the trace's end: requests the engine finished whose state the worker still holds,
        reported at the step that should have freed them (the first one scheduled after the
        finish event; none when the trace ends before it)."""
        if self._finished or not self.done:
            return []
        self._finished = True
        before = len(self.s.findings)
        last = self.steps[-1] if self.steps else None
        for rid, req in sorted(self.s.requests.items()):
            events = [e for e in self._events if e[1] == rid and e[0] >= req.intro_step]
            if not events:
                continue
            ev_step, _, ev_t = events[0]
            due = next((st for st in self.steps[bisect_right(self.steps, ev_step):]
                        if ev_t is None or self._t_ns[st] > ev_t), None)
            if due is None or last is None:
                continue
            self._report("worker.never_freed", due, rid,
                         f"finished at step {ev_step}; its id never reached the worker in "
                         f"finished_req_ids, so its state stays cached")
        return self.s.findings[before:]

    # -- display ----------------------------------------------------------------------------
    def state(self) -> dict:
        """The worker's state before step index `pos`, as plain data."""
        s = self.s
        return {
            "engine": self.engine,
            "position": s.pos,
            "next_step": self.steps[s.pos] if s.pos < len(self.steps) else None,
            "requests": {rid: r.plain() for rid, r in sorted(s.requests.items())},
            "batch": [r for r in s.slots if r is not None],
            "encoder_cache": sorted(s.encoder),
            "block_holders": {f"{g}:{b}": sorted(h) for (g, b), h in sorted(s.holders.items())},
        }


def run_shadow(trace, strict_order: bool = False,
               progress: Callable[[int, int], None] | None = None,
               cancel: Callable[[], bool] | None = None) -> list[Finding]:
    """Every engine of a trace through the shadow worker; its findings, sorted by step."""
    out: list[Finding] = []
    for engine in trace.engines:
        w = ShadowWorker(engine, strict_order=strict_order)
        if not w.run(progress=progress, cancel=cancel):
            break
        out.extend(w.findings)
    out.sort(key=lambda f: (f.engine or "", -1 if f.step is None else f.step, f.req_id or ""))
    return out
