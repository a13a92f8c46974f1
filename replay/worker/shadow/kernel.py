"""The fast path's kernel: what steps k0..k1-1 change, worked out with numpy a chunk of steps at a
time from the engine's columns (columns.py), so that a fast step (fast.py) only applies it.

A step is fast unless something in it could report more than a shared block or an output
mismatch (`Chunk.slow`); whether the batch is as the fast path expects is the worker's to tell
(State.fast_ok), from the state, not from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vllm_contract.replay.worker.shadow.columns import CACHED, NEW, Columns, Scheduled, spans

# Steps whose columns are prepared together (a goto to anywhere prepares one such span).
CHUNK_STEPS = 512


@dataclass(slots=True, eq=False)
class Chunk:
    """What the fast path needs of steps k0..k1-1, per step j = index - k0. The changes are flat
    lists, each with per-step offsets (`xo[j]..xo[j + 1]` are step j's entries of `freed`)."""

    k0: int
    k1: int
    slow: list[bool]  # the step is for the full path
    busy: list[bool]  # anything below changes in the step
    upto: list[int]  # the finish events released by then
    upd: list[bool]  # the step has a model output
    out: list[bool]  # ... which lists other ids than those scheduled
    fin: list[str]  # finished ids
    fo: list[int]
    freed: list  # encoder outputs freed (mm hashes)
    xo: list[int]
    # ids leaving the batch, with their row in the previous step
    l_rid: list[str]
    l_nct: list[int]
    l_nout: list[int]
    l_kind: list[int]
    lo: list[int]
    # block ids: row x's groups are goff[g0[x]..g1[x]], group g's ids flat[goff[g]:goff[g + 1]]
    # (no Python list per row: millions of lists kept alive cost more in garbage collection
    # than in making them)
    goff: list[int]
    flat: list[int]
    # new requests
    n_rid: list[str]
    n_nct: list[int]
    n_g0: list[int]
    n_g1: list[int]
    n_plen: list
    no: list[int]
    # cached requests entering the batch (c_enter) or given blocks (c_blk)
    c_rid: list[str]
    c_nct: list[int]
    c_nout: list[int]
    c_blk: list[bool]
    c_g0: list[int]
    c_g1: list[int]
    c_enter: list[bool]
    co: list[int]


class _NoChunk:
    k0 = k1 = 0


NO_CHUNK = _NoChunk()


@dataclass(slots=True)
class _Rows:
    """The scheduled rows of a chunk and of the step before it: step J = 0 is step index k0 - 1
    (no rows when k0 is 0), J = j + 1 is step index k0 + j; `cnt`/`start`: each J's rows."""

    rows: np.ndarray  # row numbers in the scheduled columns
    J: np.ndarray
    cnt: np.ndarray
    start: np.ndarray
    code: np.ndarray
    kind: np.ndarray
    nst_ok: np.ndarray
    mine: np.ndarray  # the row is in the chunk (J > 0)
    r0: int  # the chunk's own rows: r0..r1-1
    r1: int


@dataclass(slots=True)
class _Blocks:
    """Each row's new block ids as a group range into `goff` (g0..g1), or at = -1 for none."""

    at: np.ndarray
    g0: np.ndarray
    g1: np.ndarray
    goff: list[int]
    flat: list[int]


class _Offsets:
    """Per-step offsets of a flat list's entries; a step with any entry is busy."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.busy = np.zeros(n, bool)

    def __call__(self, js: np.ndarray) -> list[int]:
        self.busy[js] = True
        return np.searchsorted(js, np.arange(self.n + 1)).tolist()


def prepare(cols: Columns, k0: int, k1: int) -> Chunk:
    """The chunk of steps k0..k1-1."""
    n = k1 - k0
    r = _span(cols.sc, k0, k1)
    slow = _odd_steps(cols, r, k0, k1)
    in_prev, dup, leave_rows, leave_at = _against_previous(r, n)
    slow |= dup
    slow[r.J[r.mine & (r.kind == NEW) & in_prev]] = True  # a new request the batch holds
    fin_at, fin_code = _finished_scheduled(cols, r, k0, k1, slow)
    out, upd = _outputs_differ(cols, r, k0, k1)
    blocks = _blocks(cols.sc, r, slow)
    steps = np.asarray(cols.steps[k0:k1], dtype=np.int64)
    offsets = _Offsets(n)
    ids = cols.ids.ids
    changes = {"fin": [ids[c] for c in fin_code.tolist()], "fo": offsets(fin_at),
               **_freed(cols, k0, k1, offsets),
               **_leaving(cols, r, leave_rows, leave_at, offsets),
               **_new(cols, r, blocks, k0, offsets),
               **_cached(cols, r, blocks, in_prev, offsets)}
    return Chunk(k0=k0, k1=k1, slow=slow[1:].tolist(), busy=offsets.busy.tolist(),
                 upto=np.searchsorted(cols.event_steps_np, steps - 1, "right").tolist(),
                 upd=upd, out=out, goff=blocks.goff, flat=blocks.flat, **changes)


def _span(sc: Scheduled, k0: int, k1: int) -> _Rows:
    rows, J, cnt = spans(sc.lo, sc.hi, max(k0 - 1, 0), k1)
    if k0 == 0:
        J, cnt = J + 1, np.concatenate([[0], cnt])
    start = np.cumsum(cnt) - cnt
    own = cnt[1:].sum()
    return _Rows(rows=rows, J=J, cnt=cnt, start=start, code=sc.code[rows], kind=sc.kind[rows],
                 nst_ok=sc.nst_ok[rows], mine=J > 0,
                 r0=int(rows[start[1]]) if own else 0, r1=int(rows[-1]) + 1 if own else 0)


def _odd_steps(cols: Columns, r: _Rows, k0: int, k1: int) -> np.ndarray:
    """Per J, whether the step schedules what only the full path takes: a resumed or unknown
    kind, a null count, encoder inputs, a null id, preemptions or multimodal inputs."""
    sc, t, mine = cols.sc, cols.tables, r.mine
    slow = np.zeros(k1 - k0 + 1, bool)
    odd = mine & ((r.kind > CACHED) | ~r.nst_ok | ((r.kind == CACHED) & ~sc.nout_ok[r.rows]))
    ea, eb = sc.enc.span(r.r0, r.r1)
    if eb > ea:
        has_enc = np.zeros(r.r1 - r.r0, bool)
        has_enc[sc.enc.rows[ea:eb] - r.r0] = True
        odd[mine] |= has_enc[r.rows[mine] - r.r0]
    slow[r.J[odd]] = True
    if None in cols.ids.code:
        slow[r.J[mine & (r.code == cols.ids.code[None])]] = True
    for name in ("preempted", "mm_inputs"):
        slow[1:] |= (t[name].hi[k0:k1] - t[name].lo[k0:k1]) > 0
    return slow


def _against_previous(r: _Rows, n: int):
    """Each step against the previous one, position by position: most steps schedule the same
    ids in the same order, and only those that do not are compared as sets. Returns whether
    each row was scheduled with a count in the previous step, which steps schedule an id twice
    (as a slow flag per J), and the previous step's rows whose ids leave (with their j)."""
    code, nst_ok, J, cnt, start = r.code, r.nst_ok, r.J, r.cnt, r.start
    idx = np.arange(r.rows.size)
    same_len = np.zeros(n + 1, bool)
    same_len[1:] = cnt[1:] == cnt[:-1]
    tgt = np.where(same_len[J], start[np.maximum(J - 1, 0)] + idx - start[J], idx)
    eq = same_len[J] & (code[tgt] == code) & nst_ok[tgt]
    same = same_len.copy()
    same[J[~eq]] = False
    same[0] = False
    in_prev = r.mine.copy()
    dup = np.zeros(n + 1, bool)
    leave_rows: list[int] = []
    leave_at: list[int] = []
    changed = np.flatnonzero(~same).tolist()
    if changed:
        cl = code.tolist()
        okl = nst_ok.tolist()
        st, ct = start.tolist(), cnt.tolist()
        not_prev = []
        for j in changed:
            cur = cl[st[j]:st[j] + ct[j]]
            cset = set(cur)
            dup[j] = len(cset) != len(cur)
            if j == 0:
                continue
            p0 = st[j - 1]
            prev = {c for c, ok in zip(cl[p0:p0 + ct[j - 1]], okl[p0:p0 + ct[j - 1]]) if ok}
            for x, c in enumerate(cur, st[j]):
                if c not in prev:
                    not_prev.append(x)
            for x in range(p0, p0 + ct[j - 1]):
                if okl[x] and cl[x] not in cset:
                    leave_rows.append(x)
                    leave_at.append(j - 1)
        in_prev[not_prev] = False
    dl = dup.tolist()
    for j in range(1, n + 1):
        if same[j] and dl[j - 1]:  # the same ids as the previous step
            dl[j] = True
    return in_prev, np.array(dl, bool), leave_rows, leave_at


def _finished_scheduled(cols: Columns, r: _Rows, k0: int, k1: int, slow: np.ndarray):
    """The chunk's finished ids (their j, their codes); a step that also schedules one is for
    the full path."""
    fin = cols.tables["finished"]
    frows, fL, _ = spans(fin.lo, fin.hi, k0, k1)
    fcode = fin.code[frows]
    if fcode.size:
        fJ = fL + 1
        each = r.cnt[fJ]
        rep = np.repeat(np.arange(fcode.size), each)
        at = np.arange(int(each.sum())) - np.repeat(np.cumsum(each) - each, each) + \
            np.repeat(r.start[fJ], each)
        slow[fJ[rep[r.code[at] == fcode[rep]]]] = True
    return fL, fcode


def _outputs_differ(cols: Columns, r: _Rows, k0: int, k1: int) -> tuple[list, list]:
    """Per step, whether its model output lists other ids than it schedules (as multisets:
    position by position first, sorted where that fails), and whether it has one."""
    mo, n = cols.mo, k1 - k0
    code, J = r.code, r.J
    mrows, mL, mcnt = spans(mo.lo, mo.hi, k0, k1)
    mcode = mo.code[mrows]
    upd = cols.updated[k0:k1]
    bad = mcnt != r.cnt[1:]
    look = upd & ~bad
    if mcode.size and r.rows.size:
        moff = np.cumsum(mcnt) - mcnt
        at = np.minimum(r.start[mL + 1] + np.arange(mcode.size) - moff[mL],
                        max(0, r.rows.size - 1))
        pos_ne = np.zeros(n, bool)
        pos_ne[mL[code[at] != mcode]] = True
        hard = np.flatnonzero(look & pos_ne)
        if hard.size:
            C = max(1, len(cols.ids.ids))
            hs = np.zeros(n, bool)
            hs[hard] = True
            sm = hs[J - 1] & r.mine
            a = np.sort((J[sm] - 1).astype(np.int64) * C + code[sm])
            mm = hs[mL]
            b = np.sort(mL[mm].astype(np.int64) * C + mcode[mm])
            bad[(a[a != b] // C)] = True
    return (upd & bad).tolist(), upd.tolist()


def _freed(cols: Columns, k0: int, k1: int, offsets: _Offsets) -> dict:
    fm = cols.tables["freed_mm"]
    frm, fmL, _ = spans(fm.lo, fm.hi, k0, k1)
    hashes = fm.cols["mm_hash"]
    return {"freed": [hashes[i] for i in frm.tolist()], "xo": offsets(fmL)}


def _leaving(cols: Columns, r: _Rows, leave_rows: list[int], leave_at: list[int],
             offsets: _Offsets) -> dict:
    sc, ids = cols.sc, cols.ids.ids
    lrows = r.rows[np.asarray(leave_rows, np.int64)]
    return {"l_rid": [ids[c] for c in sc.code[lrows].tolist()],
            "l_nct": sc.nct[lrows].tolist(), "l_nout": sc.nout[lrows].tolist(),
            "l_kind": sc.kind[lrows].tolist(), "lo": offsets(np.asarray(leave_at, np.int64))}


def _blocks(sc: Scheduled, r: _Rows, slow: np.ndarray) -> _Blocks:
    """The chunk's rows' new block ids; a step with a null group or id is for the full path,
    which fails on it as it always did."""
    rows, mine, r0, r1 = r.rows, r.mine, r.r0, r.r1
    blk_at = np.full(rows.size, -1, np.int64)
    if r1 > r0:
        blk_at[mine] = sc.blk.at(r0, r1)[rows[mine] - r0]
    g0 = np.zeros(rows.size, np.int64)
    g1 = np.zeros(rows.size, np.int64)
    goff, flat = [0], []
    have = np.flatnonzero(blk_at >= 0)
    if have.size:
        a, b = int(blk_at[have[0]]), int(blk_at[have[-1]]) + 1
        arr = sc.blk.values.slice(a, b - a)
        arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        inner = arr.flatten()
        vals = inner.flatten()
        if arr.null_count or inner.null_count or vals.null_count:
            bad_rows = np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False)
                                      | _nulls_inside(arr, inner, vals))
            slow[np.unique(r.J[have[np.isin(blk_at[have] - a, bad_rows)]])] = True
        oo = arr.offsets.to_numpy().astype(np.int64)
        io = inner.offsets.to_numpy().astype(np.int64)
        g0[have] = oo[blk_at[have] - a] - oo[0]
        g1[have] = oo[blk_at[have] - a + 1] - oo[0]
        goff = (io - io[0]).tolist()
        flat = vals.to_numpy(zero_copy_only=False).tolist()
    return _Blocks(at=blk_at, g0=g0, g1=g1, goff=goff, flat=flat)


def _nulls_inside(arr, inner, vals) -> np.ndarray:
    """Per row of a list<list<int>> array: whether a group or an id in it is null."""
    oo = arr.offsets.to_numpy().astype(np.int64)
    io = inner.offsets.to_numpy().astype(np.int64)
    bad_val = np.asarray(pc.is_null(vals).to_numpy(zero_copy_only=False), bool)
    per_group = np.asarray(pc.is_null(inner).to_numpy(zero_copy_only=False), bool)
    cum = np.concatenate([[0], np.cumsum(bad_val)])
    per_group |= (cum[io[1:] - io[0]] - cum[io[:-1] - io[0]]) > 0
    cg = np.concatenate([[0], np.cumsum(per_group)])
    return (cg[oo[1:] - oo[0]] - cg[oo[:-1] - oo[0]]) > 0


def _new(cols: Columns, r: _Rows, blocks: _Blocks, k0: int, offsets: _Offsets) -> dict:
    new = r.mine & (r.kind == NEW)
    nrows = r.rows[new]
    ids = cols.ids.ids
    n_rid = [ids[c] for c in r.code[new].tolist()]
    nj = r.J[new] - 1
    rq = cols.tables["requests"]
    n_plen = [_prompt_len(rq, cols.steps[k0 + j], rid) for j, rid in zip(nj.tolist(), n_rid)]
    return {"n_rid": n_rid, "n_nct": cols.sc.nct[nrows].tolist(),
            "n_g0": blocks.g0[new].tolist(), "n_g1": blocks.g1[new].tolist(),
            "n_plen": n_plen, "no": offsets(nj)}


def _prompt_len(rq, step: int, rid: str):
    """The step's last `requests` row with this id, as a dict keyed by id keeps."""
    got = None
    r = rq.ranges.get(step)
    if r is not None:
        for y in range(r[0], r[1]):
            if rq.cols["req_id"][y] == rid:
                got = rq.cols["prompt_len"][y]
    return got


def _cached(cols: Columns, r: _Rows, blocks: _Blocks, in_prev: np.ndarray,
            offsets: _Offsets) -> dict:
    sc, ids, mine = cols.sc, cols.ids.ids, r.mine
    new = mine & (r.kind == NEW)
    enter = mine & (r.kind == CACHED) & ~in_prev
    cs = enter | (mine & ~new & (blocks.at >= 0))
    crows = r.rows[cs]
    return {"c_rid": [ids[c] for c in r.code[cs].tolist()],
            "c_nct": sc.nct[crows].tolist(), "c_nout": sc.nout[crows].tolist(),
            "c_blk": (blocks.at[cs] >= 0).tolist(),
            "c_g0": blocks.g0[cs].tolist(), "c_g1": blocks.g1[cs].tolist(),
            "c_enter": enter[cs].tolist(), "co": offsets(r.J[cs] - 1)}
