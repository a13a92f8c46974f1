"""The fast path: a step that changes little applied from its chunk (kernel.py), touching only
what changes, to the same state the full path (rules.py) reaches."""

from __future__ import annotations

from vllm_contract.replay.worker.shadow.columns import CACHED
from vllm_contract.replay.worker.shadow.kernel import CHUNK_STEPS, NO_CHUNK, Chunk, prepare
from vllm_contract.replay.worker.shadow.rules import WorkerModel
from vllm_contract.replay.worker.shadow.state import Req


class FastModel(WorkerModel):
    """The worker model with the fast path; the two chunks last prepared are kept."""

    def __init__(self, engine, strict_order: bool = False) -> None:
        super().__init__(engine, strict_order)
        self._chunks: dict[int, Chunk] = {}
        self._chunk_at = NO_CHUNK

    def _chunk(self, k: int) -> Chunk:
        k0 = k - k % CHUNK_STEPS
        ch = self._chunks.get(k0)
        if ch is None:
            if len(self._chunks) >= 2:
                self._chunks.pop(next(iter(self._chunks)))
            ch = self._chunks[k0] = prepare(self.columns, k0,
                                            min(len(self.steps), k0 + CHUNK_STEPS))
        self._chunk_at = ch
        return ch

    def _fast(self, ch: Chunk, j: int, before: int) -> bool:
        """The step in the common case (see Chunk and State.fast_ok). False, having changed
        nothing, when a request entering the batch is not one it can take."""
        s = self.s
        if ch.busy[j]:
            if not self._can_enter(ch, j):
                return False
            holes = self._fast_leave(ch, j)
            self._fast_enter(ch, j, holes)
        elif s.released_events < ch.upto[j]:
            self._release_upto(ch.upto[j])
        if ch.out[j] or (self.strict_order and ch.upd[j]):
            self._outputs(self.steps[s.pos], list(s.slots), before)
        s.stale = True
        return True

    def _can_enter(self, ch: Chunk, j: int) -> bool:
        """Every cached request entering the batch is held, not preempted and without
        multimodal features."""
        reqs = self.s.requests
        for x in range(ch.co[j], ch.co[j + 1]):
            if ch.c_enter[x]:
                r = reqs.get(ch.c_rid[x])
                if r is None or r.preempted or r.mm:
                    return False
        return True

    def _fast_leave(self, ch: Chunk, j: int) -> list[int]:
        """Finished ids, freed encoder outputs, the finish events' blocks and the ids leaving
        the batch; returns the holes left in it."""
        s = self.s
        reqs, slots = s.requests, s.slots
        holes: list[int] = []
        a, b = ch.fo[j], ch.fo[j + 1]
        if a < b:
            for rid in ch.fin[a:b]:
                req = reqs.pop(rid, None)
                s.flagged.discard(rid)
                if req is not None:
                    self._release(rid, req)
                if rid in slots:
                    h = slots.index(rid)
                    slots[h] = None
                    holes.append(h)
        a, b = ch.xo[j], ch.xo[j + 1]
        if a < b:
            for h in ch.freed[a:b]:
                s.encoder.pop(h, None)
        if s.released_events < ch.upto[j]:
            self._release_upto(ch.upto[j])
        for x in range(ch.lo[j], ch.lo[j + 1]):
            rid = ch.l_rid[x]
            if rid not in slots:
                continue  # finished above, or listed twice
            if s.stale and ch.l_kind[x] == CACHED:
                req = reqs.get(rid)
                if req is not None:
                    req.num_computed, req.num_output = ch.l_nct[x], ch.l_nout[x]
            h = slots.index(rid)
            slots[h] = None
            holes.append(h)
        return holes

    def _fast_enter(self, ch: Chunk, j: int, holes: list[int]) -> None:
        """Cached requests' counts and new blocks, then new requests; their grants; then new
        requests and cached ones entering the batch, in that order, into its holes."""
        s = self.s
        reqs, slots = s.requests, s.slots
        to_add: list[str] = []
        enter_add: list[str] = []
        grants: list[tuple] = []
        step = self.steps[s.pos]
        flat, goff = ch.flat, ch.goff
        for x in range(ch.co[j], ch.co[j + 1]):
            rid = ch.c_rid[x]
            req = reqs[rid]
            nc = ch.c_nct[x]
            if ch.c_blk[x]:
                nb = [flat[goff[g]:goff[g + 1]] for g in range(ch.c_g0[x], ch.c_g1[x])]
                for g, add in enumerate(nb):
                    while len(req.blocks) <= g:
                        req.blocks.append([])
                    req.blocks[g].extend(add)
                grants.append((rid, "cached", nb, nc))
            req.num_computed, req.num_output = nc, ch.c_nout[x]
            if ch.c_enter[x]:
                enter_add.append(rid)
        for x in range(ch.no[j], ch.no[j + 1]):
            rid = ch.n_rid[x]
            nc = ch.n_nct[x]
            blocks = [flat[goff[g]:goff[g + 1]] for g in range(ch.n_g0[x], ch.n_g1[x])]
            old = reqs.get(rid)
            if old is not None:
                self._release(rid, old)
            reqs[rid] = Req(rid, ch.n_plen[x], nc, blocks, [], step)
            s.flagged.discard(rid)
            to_add.append(rid)
            grants.append((rid, "new", blocks, nc))
        to_add += enter_add
        if grants:
            self._grant(step, grants)
        if holes or to_add:
            holes.sort()
            for rid in to_add:
                if holes:
                    slots[holes.pop(0)] = rid
                else:
                    slots.append(rid)
            self._condense()

    def _grant(self, step: int, grants: list) -> None:
        """_acquire for a fast step (cached requests' grants first, then new ones; none
        resumed, so no pair goes uncompared): a request whose blocks nobody else holds takes
        them without the full judgement."""
        holders = self.s.holders
        for grant in grants:
            rid, _, blocks, _ = grant
            alone = True
            for g, group in enumerate(blocks):
                for b in group:
                    held = holders.get((g, b))
                    if held is not None and b != 0 and (len(held) > 1 or rid not in held):
                        alone = False
                        break
                if not alone:
                    break
            if not alone:
                self._acquire(step, [grant])
                continue
            self._hold(rid, blocks)
