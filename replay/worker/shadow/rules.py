"""The worker model's rules: what vLLM's worker does with each SchedulerOutput, applied to the
shadow state (state.py) from the engine's columns (columns.py). `WorkerModel._slow` is the full
path, which follows `_update_states` row by row; the parts below it (releasing and granting
blocks, the persistent batch's condense, the encoder cache, the model output against the batch)
are also what the fast path (fast.py) applies. Every finding of the shadow worker is reported
here or there."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from vllm_contract.findings import Finding
from vllm_contract.kinds import KINDS
from vllm_contract.kv_groups import release_rule
from vllm_contract.replay.worker.shadow.columns import CACHED, Columns
from vllm_contract.replay.worker.shadow.state import Req, State


@dataclass(slots=True)
class _Step:
    """One step on the full path: its scheduled rows (columns of Python values), sorted by
    kind, and what applying them gathers."""

    step: int
    sc: dict[str, list]
    new_rows: list[int] = field(default_factory=list)
    cached_rows: list[int] = field(default_factory=list)  # cached and resumed
    enc_rows: list[int] = field(default_factory=list)  # with encoder inputs
    nst: dict[str, int] = field(default_factory=dict)  # token counts scheduled, by id
    resumed: set = field(default_factory=set)
    known_now: set = field(default_factory=set)  # introduced, adopted or freed in this step
    in_batch: set = field(default_factory=set)  # the batch once unscheduled requests left
    to_add: list[str] = field(default_factory=list)  # new and re-entering requests, in order
    acquired: list[tuple] = field(default_factory=list)  # (rid, kind, new blocks, computed)

    @classmethod
    def of(cls, step: int, sc: dict[str, list]) -> _Step:
        st = cls(step, sc)
        for i, (rid, kind, n, enc) in enumerate(zip(sc["req_id"], sc["kind"],
                                                    sc["num_scheduled_tokens"],
                                                    sc["encoder_inputs"])):
            if kind == "new":
                st.new_rows.append(i)
            elif kind in ("cached", "resumed"):
                st.cached_rows.append(i)
            if n is not None:
                st.nst[rid] = n
            if enc:
                st.enc_rows.append(i)
        st.resumed = {sc["req_id"][i] for i in st.cached_rows if sc["kind"][i] == "resumed"}
        return st


class WorkerModel:
    """The shadow state `s` of one engine and the rules that change it. The columns' parts the
    per-step code reads are kept as attributes of their own (`steps`, `_sc`, `_t`, ...)."""

    def __init__(self, engine, strict_order: bool = False) -> None:
        self.engine = engine.name
        m = self.manifest = engine.manifest
        self.block_size = (m.get("engine") or {}).get("block_size")
        # the groups whose blocks are freed while their request runs (sliding window, chunked
        # local, Mamba), by index: a holder there lets a block go once its window passed it
        groups = (m.get("engine") or {}).get("kv_cache_groups") or []
        self._windows = {g: r for g, r in ((g, release_rule(grp)) for g, grp in enumerate(groups))
                         if r is not None}
        if groups and all(grp.get("block_size") for grp in groups):
            # prefix hits are counted per group, each at its own block size
            self.block_size = min(grp["block_size"] for grp in groups)
        self._now: tuple[int, dict[str, int]] = (-1, {})
        self.mid_stream = bool(m.get("attached_mid_stream"))
        self.strict_order = strict_order
        cols = self.columns = Columns(engine)
        self.steps: list[int] = cols.steps
        self._ids, self._sc, self._mo, self._t = cols.ids, cols.sc, cols.mo, cols.tables
        self._updated = cols.updated
        self._events, self._event_steps = cols.events, cols.event_steps
        self.s = State()
        self._finished = False

    @property
    def done(self) -> bool:
        return self.s.pos >= len(self.steps)

    @property
    def findings(self) -> list[Finding]:
        return self.s.findings

    def _report(self, inv: str, step: int, req_id: str | None, details: str) -> None:
        self.s.findings.append(KINDS[inv].finding(step, req_id, details, self.engine))

    def _sync(self) -> None:
        """Write the batch's token counts a run of fast steps left unwritten: each request's
        from its row in the previous step (every request in the batch has one there)."""
        s = self.s
        if not s.stale:
            return
        s.stale = False
        sc, k = self._sc, s.pos - 1
        lo, hi = int(sc.lo[k]), int(sc.hi[k])
        ids, reqs = self._ids.ids, s.requests
        for c, kind, nc, no in zip(sc.code[lo:hi].tolist(), sc.kind[lo:hi].tolist(),
                                   sc.nct[lo:hi].tolist(), sc.nout[lo:hi].tolist()):
            if kind == CACHED:
                req = reqs.get(ids[c])
                if req is not None:
                    req.num_computed, req.num_output = nc, no

    def _known(self, rid, now: set) -> bool:
        """Introduced, adopted or freed before: in an earlier step (a scheduled row of any kind
        but an unknown one, or a finished id), or earlier in this one (`now`)."""
        if rid in now:
            return True
        c = self._ids.code.get(rid)
        return c is not None and int(self.columns.first_seen()[c]) < self.s.pos

    # -- the full path ----------------------------------------------------------------------
    def _slow(self, before: int) -> None:
        """The step row by row, as _update_states applies it."""
        self._sync()
        s = self.s
        st = _Step.of(self.steps[s.pos], self._sc.rows(s.pos, self._ids.ids))
        self._take_back(st)
        # unscheduled requests leave the batch, their state kept
        stay = set(st.nst) - st.resumed
        for rid in [r for r in s.slots if r is not None and r not in stay]:
            self._remove(rid)
        st.in_batch = {r for r in s.slots if r is not None}
        self._introduce(st)
        for i in st.cached_rows:
            self._cached_row(st, i)
        self._acquire(st.step, st.acquired)
        # new and re-entering requests fill the smallest free slots, then the batch condenses
        holes = sorted(i for i, r in enumerate(s.slots) if r is None)
        for rid in st.to_add:
            if holes:
                s.slots[holes.pop(0)] = rid
            else:
                s.slots.append(rid)
        self._condense()
        self._encoder(st.step, st.sc, st.enc_rows, st.nst)
        self._close(st, before)

    def _take_back(self, st: _Step) -> None:
        """Finished ids first: state popped, batch slot freed (unknown ids tolerated); then
        encoder outputs freed, and the blocks the scheduler took back: preempted in this step,
        finished before it."""
        s, t, step = self.s, self._t, st.step
        fc = t["finished"].cols
        for i in t["finished"].rows(step):
            rid = fc["req_id"][i]
            req = s.requests.pop(rid, None)
            s.flagged.discard(rid)
            st.known_now.add(rid)
            if req is not None:
                self._release(rid, req)
            self._remove(rid)
        fm = t["freed_mm"].cols
        for i in t["freed_mm"].rows(step):
            s.encoder.pop(fm["mm_hash"][i], None)
        pc_ = t["preempted"].cols
        for i in t["preempted"].rows(step):
            req = s.requests.get(pc_["req_id"][i])
            if req is not None:
                req.preempted = True
                self._release(req.req_id, req)
        self._release_events(step)

    def _introduce(self, st: _Step) -> None:
        """The step's new requests: cached whole, with the blocks they are given."""
        s, t, sc, step = self.s, self._t, st.sc, st.step
        rq, mm = t["requests"].cols, t["mm_inputs"].cols
        prompt_len = {rq["req_id"][i]: rq["prompt_len"][i] for i in t["requests"].rows(step)}
        feats: dict[str, list] = {}
        for i in t["mm_inputs"].rows(step):
            feats.setdefault(mm["req_id"][i], []).append(
                (mm["identifier"][i], mm["offset"][i], mm["length"][i]))
        for i in st.new_rows:
            rid = sc["req_id"][i]
            blocks = [list(g) for g in (sc["new_block_ids"][i] or [])]
            req = Req(rid, prompt_len.get(rid), sc["num_computed_tokens"][i] or 0, blocks,
                      feats.get(rid, []), step)
            old = s.requests.get(rid)
            if old is not None:  # a streaming update in vLLM; the catalog judges reuse
                self._release(rid, old)
            s.requests[rid] = req
            s.flagged.discard(rid)
            st.known_now.add(rid)
            if rid not in st.in_batch:
                st.to_add.append(rid)
            st.acquired.append((rid, "new", blocks, req.num_computed))

    def _cached_row(self, st: _Step, i: int) -> None:
        """A cached or resumed request's row: its table replaced (resumed) or appended to."""
        sc = st.sc
        rid = sc["req_id"][i]
        is_resumed = rid in st.resumed
        nb = sc["new_block_ids"][i]
        computed = sc["num_computed_tokens"][i] or 0
        req = self.s.requests.get(rid)
        if req is None:
            req = self._adopt(st, rid, computed)
            if not is_resumed:
                # adopted: what the trace tells is only the blocks it appends now
                req.blocks = [list(g) for g in (nb or [])]
                nb = None
        if is_resumed:
            self._resume(st, rid, req, nb, computed)
        else:
            self._append(st, rid, req, nb, computed)
        req.num_computed = computed
        nout = sc["num_output_tokens"][i]
        if nout is not None:
            req.num_output = nout
        if rid not in st.in_batch:
            st.to_add.append(rid)

    def _adopt(self, st: _Step, rid: str, computed: int) -> Req:
        """A request scheduled as cached that the worker does not hold: reported, unless the
        trace attached to a running engine that may have held it from before; held from now."""
        s = self.s
        if not (self.mid_stream and not self._known(rid, st.known_now)):
            if rid not in s.flagged:
                self._report("worker.unknown_cached", st.step, rid,
                             "never introduced as new, or already freed")
            s.flagged.add(rid)
        req = s.requests[rid] = Req(rid, None, computed, [], [], st.step, adopted=True)
        st.known_now.add(rid)
        return req

    def _resume(self, st: _Step, rid: str, req: Req, nb, computed: int) -> None:
        step = st.step
        if rid in st.in_batch:
            self._report("worker.resumed_without_table", step, rid,
                         "resumed while still in the persistent batch")
        elif nb is None:
            self._report("worker.resumed_without_table", step, rid,
                         "resumed with new_block_ids None: nothing to replace the "
                         "stale table with")
        else:
            short = self._short(nb, computed + st.nst.get(rid, 0))
            if short:
                self._report("worker.resumed_without_table", step, rid, short)
        if nb is not None:
            req.blocks = [list(g) for g in nb]
            st.acquired.append((rid, "resumed", req.blocks, computed))
        req.preempted = False

    def _append(self, st: _Step, rid: str, req: Req, nb, computed: int) -> None:
        if req.preempted:
            self._report("worker.stale_table_append", st.step, rid,
                         "preempted earlier and not in resumed_req_ids: the worker "
                         "appends to the table whose blocks were freed")
            req.preempted = False
        if nb is not None:
            for g, add in enumerate(nb):
                while len(req.blocks) <= g:
                    req.blocks.append([])
                req.blocks[g].extend(add)
            st.acquired.append((rid, "cached", nb, computed))

    def _close(self, st: _Step, before: int) -> None:
        """Scheduled ids the batch lacks, the model output against the batch, and whether the
        fast path may take the next step (see State.fast_ok)."""
        s, sc = self.s, st.sc
        batch = [r for r in s.slots if r is not None]
        members = set(batch)
        for rid in st.nst:
            if rid not in members:
                self._report("worker.unknown_scheduled", st.step, rid,
                             f"{st.nst[rid]} token(s) scheduled; the worker computes none")
        self._outputs(st.step, batch, before)
        counted = [r for r, n in zip(sc["req_id"], sc["num_scheduled_tokens"]) if n is not None]
        s.fast_ok = (len(members) == len(s.slots) and members == set(counted)
                     and all(r is not None and not r.preempted and not r.mm
                             for r in map(s.requests.get, s.slots)))

    # -- the parts of a step ----------------------------------------------------------------
    def _release_events(self, step: int) -> None:
        self._release_upto(bisect_right(self._event_steps, step - 1))

    def _release_upto(self, upto: int) -> None:
        """The blocks of finish events before index `upto` go back to the scheduler."""
        s = self.s
        while s.released_events < upto:
            rid = self._events[s.released_events][1]
            req = s.requests.get(rid)
            if req is not None:
                self._release(rid, req)
            s.released_events += 1

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

    def _hold(self, rid: str, blocks: list) -> None:
        """`rid` holds each of `blocks` (one list per KV cache group), beside any holder."""
        holders = self.s.holders
        for g, group in enumerate(blocks):
            for b in group:
                held = holders.get((g, b))
                if held is None:
                    holders[(g, b)] = {rid}
                else:
                    held.add(rid)

    def _acquire(self, step: int, acquired: list) -> None:
        """Blocks handed out this step, in the scheduler's order (running requests, then new
        ones in list order, then resumed: a resumed and a new request are not compared, their
        order in a step is unknown). Prefix-cache hits may share as many blocks as a new or
        resumed request's computed tokens cover, also blocks filled in this very step."""
        holders = self.s.holders
        order = {"cached": 0, "new": 1, "resumed": 2}
        this_step: dict[str, str] = {}
        for rid, kind, blocks, computed in sorted(acquired, key=lambda a: order[a[1]]):
            shared_by_group: dict[int, int] = {}
            example = None
            for g, group in enumerate(blocks):
                for b in group:
                    if b == 0:  # the null block: a placeholder many tables carry
                        continue
                    held = holders.get((g, b))
                    if not held or (len(held) == 1 and rid in held):
                        continue
                    if g in self._windows:
                        for h in [h for h in held if h != rid and self._passed(h, g, b)]:
                            held.discard(h)
                    others = {h for h in held if h != rid
                              and not ({kind, this_step.get(h)} == {"new", "resumed"})}
                    if others:
                        shared_by_group[g] = shared_by_group.get(g, 0) + 1
                        example = example or (b, min(others))
            if example is not None:
                prefix = (computed // self.block_size) if self.block_size else None
                worst = max(shared_by_group.values())
                if kind == "cached" or (prefix is not None and worst > prefix):
                    allowed = 0 if kind == "cached" else prefix
                    self._report("worker.block_shared", step, rid,
                                 f"{worst} block(s) (e.g. {example[0]}) still held by "
                                 f"{example[1]}; prefix hits cover {allowed}")
            self._hold(rid, blocks)
            this_step[rid] = kind

    def _passed(self, rid: str, g: int, b: int) -> bool:
        """Whether holder `rid`'s window in group `g` has left block `b` behind: vLLM freed it
        in the request's allocation of its latest scheduled step (this one included), so it may
        go to another request (core/kv_groups.py). Asked only when `b` has another taker."""
        req = self.s.requests.get(rid)
        table = req.blocks[g] if req is not None and g < len(req.blocks) else None
        if not table or b not in table:
            return False
        pos = len(table) - 1 - table[::-1].index(b)  # a block given again sits further on
        return self._windows[g].freed(self._computed_now(rid, req)) > pos

    def _computed_now(self, rid: str, req: Req) -> int:
        """`rid`'s computed tokens at the current step: its row there, else what the worker
        holds (a run of fast steps leaves a scheduled request's count unwritten, never an
        unscheduled one's)."""
        pos = self.s.pos
        if self._now[0] != pos:
            rows = self._sc.rows(pos, self._ids.ids)
            self._now = (pos, {r: c for r, c, n in zip(rows["req_id"],
                                                       rows["num_computed_tokens"],
                                                       rows["num_scheduled_tokens"])
                               if c is not None and n is not None})
        return self._now[1].get(rid, req.num_computed or 0)

    def _encoder(self, step: int, sc: dict, enc_rows: list[int], nst: dict[str, int]) -> None:
        """Encoder outputs computed this step are cached; then every scheduled request reads
        each input whose placeholder overlaps its window (_gather_mm_embeddings)."""
        s = self.s
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

    def _outputs(self, step: int, batch: list[str], before: int) -> None:
        k = self.s.pos
        if not self._updated[k]:
            return
        mo, idmap = self._mo, self._ids.ids
        ids = [idmap[c] for c in mo.code[int(mo.lo[k]):int(mo.hi[k])].tolist()]
        members = set(batch)
        # every finding of this step so far was reported since `before`
        flagged = {f.req_id for f in self.s.findings[before:]}
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
        self._sync()
        before = len(self.s.findings)
        last = self.steps[-1] if self.steps else None
        by_id: dict = {}
        held = self.s.requests
        for e in self._events:
            if e[1] in held:
                by_id.setdefault(e[1], []).append(e)
        for rid, req in sorted(held.items()):
            events = [e for e in by_id.get(rid, ()) if e[0] >= req.intro_step]
            if not events:
                continue
            ev_step, _, ev_t = events[0]
            due = None
            for i in range(bisect_right(self.steps, ev_step), len(self.steps)):
                if ev_t is None or self.columns.t_ns[i] > ev_t:
                    due = self.steps[i]
                    break
            if due is None or last is None:
                continue
            self._report("worker.never_freed", due, rid,
                         f"finished at step {ev_step}; its id never reached the worker in "
                         f"finished_req_ids, so its state stays cached")
        return self.s.findings[before:]
