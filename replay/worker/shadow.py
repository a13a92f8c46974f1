"""The shadow worker: a pure-Python model of the state vLLM's worker keeps (GPUModelRunner's
`_update_states`, the persistent batch of gpu_input_batch.py, `_gather_mm_embeddings`' encoder
reads), applied to a recorded trace one SchedulerOutput at a time. It reports, as findings in
`check`'s format (ids `worker.*`), where a real worker would raise or silently compute the
wrong thing. What it models and what it does not: docs/replay-shadow.md.

pyarrow only: no vLLM, no DuckDB.
"""

from __future__ import annotations

import pickle
from bisect import bisect_right, insort
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.findings import Finding
from vllm_contract.kinds import KINDS
from vllm_contract.trace import regular_file

# the tables the worker reads, and their columns; `scheduled` and `model_outputs` (a row per
# request per step) are kept as numpy columns, the others, a row per event, as Python lists
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
NEW, CACHED, RESUMED, OTHER = 0, 1, 2, 3  # a scheduled row's kind, as stored
_KIND_CODE = {"new": NEW, "cached": CACHED, "resumed": RESUMED}
_KIND_NAME = ("new", "cached", "resumed", None)
# Steps whose columns are prepared together (a goto to anywhere prepares one such span).
CHUNK_STEPS = 512
# Checkpoints are packed (pickled plain tuples); past this many bytes every other one goes and
# the interval doubles, so a long trace's checkpoints stay within it.
CHECKPOINT_BUDGET = 256 << 20
# A run forward restores a checkpoint ahead of it instead of stepping when it saves this many
# steps or more.
JUMP_STEPS = 64


def _parts(engine, table: str, columns: list[str], as_dict: tuple[str, ...] = ()):
    """The table's segments one at a time (a trace's big tables are never whole in memory as
    Arrow), or the whole table from an engine that only reads whole tables."""
    if not (hasattr(engine, "segments") and hasattr(engine, "segment")):
        part = engine.read(table, columns)
        if part.num_rows:
            yield part
        return
    root = getattr(engine, "root", None) or engine.dir
    for path in engine.segments(table):
        part = None
        if path.suffix == schema.PARQUET_SUFFIX and as_dict:
            part = _parquet(path, table, columns, as_dict, root)
        if part is None:
            part = engine.segment(path, columns)
        if part is not None and part.num_rows:
            yield part


def _parquet(path, table: str, columns: list[str], as_dict: tuple[str, ...], root):
    """A Parquet segment read as the trace reader reads it, but with the string columns
    `as_dict` left as the dictionaries the file stores (decoding a million steps' ids into
    strings, and hashing them back into codes, is most of the cost of reading them). None for
    anything but a plain readable segment of the expected schema: the trace reader then reads
    it, and reports what is wrong with it."""
    try:
        regular_file(path, root)
        found = pq.read_schema(path)
        want = schema.schema(table)
        if [(f.name, f.type) for f in found] != [(f.name, f.type) for f in want]:
            return None
        return pq.read_table(path, columns=columns, read_dictionary=list(as_dict),
                             page_checksum_verification=True)
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError,
            EOFError, TraceError):
        return None


def _ints(column, fill: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An int column as values (nulls as `fill`) and validity."""
    valid = np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)
    values = _narrow(np.asarray(pc.fill_null(column, fill).to_numpy(), dtype=np.int64))
    return values, valid


def _narrow(a: np.ndarray) -> np.ndarray:
    if a.size and (a.min() < -(2 ** 31) or a.max() >= 2 ** 31):
        return a
    return a.astype(np.int32)


def _cat(parts: list, dtype) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype)
    if any(p.dtype == np.int64 for p in parts):
        return np.concatenate([p.astype(np.int64) for p in parts])
    return np.concatenate(parts)


def _order(step: np.ndarray, pos: np.ndarray, pos_valid: np.ndarray) -> np.ndarray | None:
    """The permutation that sorts rows by step, then pos (nulls last), stably, as
    Table.sort_by does; None when they are sorted already."""
    if step.size < 2:
        return None
    nul = ~pos_valid
    same = step[1:] == step[:-1]
    ordered = step[1:] > step[:-1]
    ordered |= same & nul[1:] & ~nul[:-1]
    ordered |= same & (nul[1:] == nul[:-1]) & (nul[1:] | (pos[1:] >= pos[:-1]))
    if bool(ordered.all()):
        return None
    return np.lexsort((np.where(nul, 0, pos), nul, step))


def _spans(lo: np.ndarray, hi: np.ndarray, a: int, b: int):
    """Row numbers of step indices a..b-1, each row's step index relative to a, and each step's
    row count."""
    cnt = (hi[a:b] - lo[a:b]).astype(np.int64)
    rel = np.repeat(np.arange(b - a), cnt)
    start = np.cumsum(cnt) - cnt
    rows = np.arange(int(cnt.sum())) - np.repeat(start - lo[a:b], cnt)
    return rows.astype(np.int64), rel, cnt


class _Ids:
    """Request ids as small ints, shared by every table of an engine."""

    def __init__(self) -> None:
        self.code: dict = {}
        self.ids: list = []

    def encode(self, column) -> np.ndarray:
        return _dict_codes(column, self.map)

    def map(self, values: list) -> list[int]:
        code = self.code
        out = [code.get(x, -1) for x in values]
        for i, c in enumerate(out):
            if c < 0:
                c = code.get(values[i])
                if c is None:
                    c = code[values[i]] = len(self.ids)
                    self.ids.append(values[i])
                out[i] = c
        return out


def _kind_map(values: list) -> list[int]:
    return [_KIND_CODE.get(x, OTHER) for x in values]


def _dict_codes(column, to_codes: Callable[[list], list[int]]) -> np.ndarray:
    """A string column as codes (`to_codes` maps a chunk's distinct values, None included)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out = []
    last, m = None, None
    for ch in chunks:
        if not pa.types.is_dictionary(ch.type):
            ch = pc.dictionary_encode(ch, null_encoding="encode")
        # a Parquet read repeats its row group's dictionary in every batch
        if last is None or not (last is ch.dictionary or last.equals(ch.dictionary)):
            last = ch.dictionary
            m = np.array(to_codes(last.to_pylist() + [None]), dtype=np.int64)
        idx = pc.fill_null(ch.indices, len(ch.dictionary)).to_numpy()
        out.append(m[np.asarray(idx, dtype=np.int64)])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


class _Sparse:
    """A list column's values on the few rows that have one: row numbers, sorted, and the
    values as Arrow."""

    def __init__(self, rows: np.ndarray, values) -> None:
        self.rows = rows
        self.values = values

    def span(self, r0: int, r1: int) -> tuple[int, int]:
        """The values of rows r0..r1-1: their indices a..b-1."""
        return (int(np.searchsorted(self.rows, r0)), int(np.searchsorted(self.rows, r1)))

    def at(self, r0: int, r1: int) -> np.ndarray:
        """For each row r0..r1-1, the index of its value, or -1."""
        out = np.full(r1 - r0, -1, np.int64)
        a, b = self.span(r0, r1)
        out[self.rows[a:b] - r0] = np.arange(a, b)
        return out

    def get(self, at: np.ndarray) -> list:
        """The values at indices `at` (-1: None), as Python lists."""
        out = [None] * len(at)
        have = np.flatnonzero(at >= 0)
        if have.size:
            a, b = int(at[have[0]]), int(at[have[-1]]) + 1
            vals = self.values.slice(a, b - a).to_pylist()
            for j, i in zip(have.tolist(), (at[have] - a).tolist()):
                out[j] = vals[i]
        return out


class _Scheduled:
    """The `scheduled` table as numpy columns in (step, pos) order: id codes, kinds, the three
    token counts (nulls as 0 with validity where a null means something), and sparse block ids
    and encoder inputs; `lo`/`hi`: each step index's rows."""

    def __init__(self, engine, ids: _Ids, steps: np.ndarray) -> None:
        cols: dict[str, list] = {k: [] for k in ("step", "pos", "pos_ok", "code", "kind", "nst",
                                                 "nst_ok", "nct", "nout", "nout_ok")}
        blk_rows, blk_vals, enc_rows, enc_vals = [], [], [], []
        n = 0
        for part in _parts(engine, "scheduled", _COLUMNS["scheduled"], ("req_id", "kind")):
            cols["step"].append(_narrow(np.asarray(part.column("step").to_numpy(), np.int64)))
            pos, pos_ok = _ints(part.column("pos"))
            cols["pos"].append(pos)
            cols["pos_ok"].append(pos_ok)
            cols["code"].append(_narrow(ids.encode(part.column("req_id"))))
            cols["kind"].append(_dict_codes(part.column("kind"), _kind_map).astype(np.int8))
            for name, col in (("nst", "num_scheduled_tokens"), ("nct", "num_computed_tokens"),
                              ("nout", "num_output_tokens")):
                v, ok = _ints(part.column(col))
                cols[name].append(v)
                if name != "nct":  # `num_computed_tokens or 0` is all that is read
                    cols[name + "_ok"].append(ok)
            nb = part.column("new_block_ids")
            have = np.flatnonzero(np.asarray(pc.is_valid(nb).to_numpy(zero_copy_only=False)))
            blk_rows.append(have + n)
            blk_vals.extend(nb.take(pa.array(have)).chunks)
            enc = part.column("encoder_inputs")
            if enc.null_count < len(enc):
                lens = np.asarray(pc.fill_null(pc.list_value_length(enc), 0).to_numpy())
                have = np.flatnonzero(lens > 0)  # an empty list reads as no encoder input
                enc_rows.append(have + n)
                enc_vals.extend(enc.take(pa.array(have)).chunks)
            n += part.num_rows
        cat = {}
        for k in list(cols):
            cat[k] = _cat(cols.pop(k), bool if k.endswith("_ok") else np.int32)
        sch = schema.schema("scheduled")
        blk = _Sparse(_cat(blk_rows, np.int64).astype(np.int64),
                      pa.chunked_array(blk_vals, sch.field("new_block_ids").type))
        enc = _Sparse(_cat(enc_rows, np.int64).astype(np.int64),
                      pa.chunked_array(enc_vals, sch.field("encoder_inputs").type))
        order = _order(cat["step"], cat["pos"], cat["pos_ok"])
        del cat["pos"], cat["pos_ok"]
        if order is not None:
            for k in cat:
                cat[k] = cat[k][order]
            inv = np.empty(order.size, np.int64)
            inv[order] = np.arange(order.size)
            for sp in (blk, enc):
                moved = inv[sp.rows]
                o = np.argsort(moved, kind="stable")
                sp.rows = moved[o]
                sp.values = sp.values.take(pa.array(o))
        step = cat.pop("step")
        self.lo = np.searchsorted(step, steps, "left")
        self.hi = np.searchsorted(step, steps, "right")
        del step
        self.code, self.kind = cat["code"], cat["kind"]
        self.nst, self.nst_ok = cat["nst"], cat["nst_ok"]
        self.nct = cat["nct"]
        self.nout, self.nout_ok = cat["nout"], cat["nout_ok"]
        self.blk, self.enc = blk, enc


class _Outputs:
    """`model_outputs`' request ids (codes) in (step, pos) order, with each step index's rows."""

    def __init__(self, engine, ids: _Ids, steps: np.ndarray) -> None:
        st, pos, ok, code = [], [], [], []
        for part in _parts(engine, "model_outputs", _COLUMNS["model_outputs"], ("req_id",)):
            st.append(_narrow(np.asarray(part.column("step").to_numpy(), np.int64)))
            p, v = _ints(part.column("pos"))
            pos.append(p)
            ok.append(v)
            code.append(_narrow(ids.encode(part.column("req_id"))))
        step, code_ = _cat(st, np.int32), _cat(code, np.int32)
        order = _order(step, _cat(pos, np.int32), _cat(ok, bool))
        if order is not None:
            step, code_ = step[order], code_[order]
        self.lo = np.searchsorted(step, steps, "left")
        self.hi = np.searchsorted(step, steps, "right")
        self.code = code_


class _Table:
    """A small table's columns as Python lists, sorted by step (then pos), with each step's row
    range: no per-row dicts."""

    def __init__(self, table: pa.Table, ids: _Ids | None = None,
                 steps: np.ndarray | None = None) -> None:
        keys = [("step", "ascending")]
        if "pos" in table.column_names:
            keys.append(("pos", "ascending"))
        table = table.sort_by(keys)
        self.cols = {c: table.column(c).to_pylist() for c in table.column_names}
        step = np.asarray(table.column("step").to_numpy(), dtype=np.int64)
        uniq, first, count = np.unique(step, return_index=True, return_counts=True)
        self.ranges: dict[int, tuple[int, int]] = {
            s: (a, a + c) for s, a, c in zip(uniq.tolist(), first.tolist(), count.tolist())}
        if steps is not None:  # each step index's rows, for the vectorised passes
            self.lo = np.searchsorted(step, steps, "left")
            self.hi = np.searchsorted(step, steps, "right")
        if ids is not None and "req_id" in table.column_names:
            self.code = ids.encode(table.column("req_id"))

    def rows(self, step: int) -> range:
        lo, hi = self.ranges.get(step, (0, 0))
        return range(lo, hi)


class _Chunk:
    """What the fast path needs of steps k0..k1-1, worked out a chunk at a time: which steps it
    cannot take (`slow`); for each step whose `busy` is set, what changes: finished ids, freed
    encoder outputs, ids leaving the batch (each with its row in the previous step), new
    requests, cached ones entering the batch or given blocks (flat lists, each with per-step
    offsets); `upto`, the finish events released by then; `upd`, whether the step has a model
    output, and `out`, whether it lists other ids than those scheduled."""

    __slots__ = ("busy", "c_blk", "c_enter", "c_g0", "c_g1", "c_nct", "c_nout", "c_rid", "co",
                 "fin", "flat", "fo", "freed", "goff", "k0", "k1", "l_kind", "l_nct", "l_nout",
                 "l_rid", "lo", "n_g0", "n_g1", "n_nct", "n_plen", "n_rid", "no", "out", "slow",
                 "upd", "upto", "xo")

    def __init__(self, w: ShadowWorker, k0: int, k1: int) -> None:
        sc, mo, t = w._sc, w._mo, w._t
        n = k1 - k0
        ids = w._ids.ids
        self.k0, self.k1 = k0, k1
        # the chunk's rows and the previous step's: step J = 0 is step index k0 - 1 (no rows
        # when k0 is 0), J = j + 1 is step index k0 + j
        rows, J, cnt = _spans(sc.lo, sc.hi, max(k0 - 1, 0), k1)
        if k0 == 0:
            J, cnt = J + 1, np.concatenate([[0], cnt])
        start = np.cumsum(cnt) - cnt
        code = sc.code[rows]
        kind = sc.kind[rows]
        nst_ok = sc.nst_ok[rows]
        mine = J > 0
        r0 = int(rows[start[1]]) if cnt[1:].sum() else 0
        r1 = int(rows[-1]) + 1 if cnt[1:].sum() else 0

        slow = np.zeros(n + 1, bool)
        odd = mine & ((kind > CACHED) | ~nst_ok | ((kind == CACHED) & ~sc.nout_ok[rows]))
        ea, eb = sc.enc.span(r0, r1)
        if eb > ea:
            has_enc = np.zeros(r1 - r0, bool)
            has_enc[sc.enc.rows[ea:eb] - r0] = True
            odd[mine] |= has_enc[rows[mine] - r0]
        slow[J[odd]] = True
        if None in w._ids.code:
            slow[J[mine & (code == w._ids.code[None])]] = True
        for name in ("preempted", "mm_inputs"):
            slow[1:] |= (t[name].hi[k0:k1] - t[name].lo[k0:k1]) > 0

        # Each step against the previous one, position by position: most steps schedule the
        # same ids in the same order, and only those that do not are compared as sets.
        idx = np.arange(rows.size)
        same_len = np.zeros(n + 1, bool)
        same_len[1:] = cnt[1:] == cnt[:-1]
        tgt = np.where(same_len[J], start[np.maximum(J - 1, 0)] + idx - start[J], idx)
        eq = same_len[J] & (code[tgt] == code) & nst_ok[tgt]
        same = same_len.copy()
        same[J[~eq]] = False
        same[0] = False
        in_prev = mine.copy()  # scheduled with a count in the previous step
        dup = np.zeros(n + 1, bool)
        leave_rows: list[int] = []
        leave_at: list[int] = []
        cl = None
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
                for r, c in enumerate(cur, st[j]):
                    if c not in prev:
                        not_prev.append(r)
                for r in range(p0, p0 + ct[j - 1]):
                    if okl[r] and cl[r] not in cset:
                        leave_rows.append(r)
                        leave_at.append(j - 1)
            in_prev[not_prev] = False
        dl = dup.tolist()
        for j in range(1, n + 1):
            if same[j] and dl[j - 1]:  # the same ids as the previous step
                dl[j] = True
        slow |= np.array(dl, bool)
        slow[J[mine & (kind == NEW) & in_prev]] = True  # a new request the batch holds

        # finished ids: scheduled in the same step too, the full path takes it
        fin = t["finished"]
        frows, fL, _ = _spans(fin.lo, fin.hi, k0, k1)
        fcode = fin.code[frows]
        if fcode.size:
            fJ = fL + 1
            each = cnt[fJ]
            rep = np.repeat(np.arange(fcode.size), each)
            at = np.arange(int(each.sum())) - np.repeat(np.cumsum(each) - each, each) + \
                np.repeat(start[fJ], each)
            slow[fJ[rep[code[at] == fcode[rep]]]] = True
        self.slow = slow[1:].tolist()

        # the model output against the scheduled ids, as multisets: position by position
        # first, sorted where that fails
        mrows, mL, mcnt = _spans(mo.lo, mo.hi, k0, k1)
        mcode = mo.code[mrows]
        upd = w._updated[k0:k1]
        bad = mcnt != cnt[1:]
        look = upd & ~bad
        if mcode.size and rows.size:
            moff = np.cumsum(mcnt) - mcnt
            at = np.minimum(start[mL + 1] + np.arange(mcode.size) - moff[mL], max(0, rows.size - 1))
            pos_ne = np.zeros(n, bool)
            pos_ne[mL[code[at] != mcode]] = True
            hard = np.flatnonzero(look & pos_ne)
            if hard.size:
                C = max(1, len(ids))
                hs = np.zeros(n, bool)
                hs[hard] = True
                sm = hs[J - 1] & mine
                a = np.sort((J[sm] - 1).astype(np.int64) * C + code[sm])
                mm = hs[mL]
                b = np.sort(mL[mm].astype(np.int64) * C + mcode[mm])
                bad[(a[a != b] // C)] = True
        self.out = (upd & bad).tolist()
        self.upd = upd.tolist()
        steps = np.asarray(w.steps[k0:k1], dtype=np.int64)
        self.upto = np.searchsorted(w._event_steps_np, steps - 1, "right").tolist()

        # what the fast path applies, flat, with each step's offsets
        busy = np.zeros(n, bool)

        def offsets(js) -> list[int]:
            busy[js] = True
            return np.searchsorted(js, np.arange(n + 1)).tolist()

        self.fin = [ids[c] for c in fcode.tolist()]
        self.fo = offsets(fL)
        fm = t["freed_mm"]
        frm, fmL, _ = _spans(fm.lo, fm.hi, k0, k1)
        hashes = fm.cols["mm_hash"]
        self.freed = [hashes[i] for i in frm.tolist()]
        self.xo = offsets(fmL)
        lrows = rows[np.asarray(leave_rows, np.int64)]
        self.l_rid = [ids[c] for c in sc.code[lrows].tolist()]
        self.l_nct, self.l_nout = sc.nct[lrows].tolist(), sc.nout[lrows].tolist()
        self.l_kind = sc.kind[lrows].tolist()
        self.lo = offsets(np.asarray(leave_at, np.int64))

        # New and cached rows to apply: their block ids as group ranges (g0..g1) into `goff`,
        # the offsets of each group's ids in `flat` (no Python list per row: millions of
        # lists kept alive cost more in garbage collection than in making them).
        blk_at = np.full(rows.size, -1, np.int64)
        if r1 > r0:
            blk_at[mine] = sc.blk.at(r0, r1)[rows[mine] - r0]
        g0 = np.zeros(rows.size, np.int64)
        g1 = np.zeros(rows.size, np.int64)
        self.goff, self.flat = [0], []
        have = np.flatnonzero(blk_at >= 0)
        if have.size:
            a, b = int(blk_at[have[0]]), int(blk_at[have[-1]]) + 1
            arr = sc.blk.values.slice(a, b - a)
            arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
            inner = arr.flatten()
            vals = inner.flatten()
            if arr.null_count or inner.null_count or vals.null_count:
                # a null group or id: the full path fails on it as it always did
                bad_rows = np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False)
                                          | _nulls_inside(arr, inner, vals))
                slow[np.unique(J[have[np.isin(blk_at[have] - a, bad_rows)]])] = True
                self.slow = slow[1:].tolist()
            oo = arr.offsets.to_numpy().astype(np.int64)
            io = inner.offsets.to_numpy().astype(np.int64)
            g0[have] = oo[blk_at[have] - a] - oo[0]
            g1[have] = oo[blk_at[have] - a + 1] - oo[0]
            self.goff = (io - io[0]).tolist()
            self.flat = vals.to_numpy(zero_copy_only=False).tolist()
        new = mine & (kind == NEW)
        enter = mine & (kind == CACHED) & ~in_prev
        rq = t["requests"]
        nrows = rows[new]
        self.n_rid = [ids[c] for c in code[new].tolist()]
        self.n_nct = sc.nct[nrows].tolist()
        self.n_g0, self.n_g1 = g0[new].tolist(), g1[new].tolist()
        nj = J[new] - 1
        self.n_plen = []
        for j, rid in zip(nj.tolist(), self.n_rid):
            got = None
            r = rq.ranges.get(w.steps[k0 + j])
            if r is not None:  # the step's last row with this id, as a dict keeps
                for y in range(r[0], r[1]):
                    if rq.cols["req_id"][y] == rid:
                        got = rq.cols["prompt_len"][y]
            self.n_plen.append(got)
        self.no = offsets(nj)
        cs = enter | (mine & ~new & (blk_at >= 0))
        crows = rows[cs]
        self.c_rid = [ids[c] for c in code[cs].tolist()]
        self.c_nct, self.c_nout = sc.nct[crows].tolist(), sc.nout[crows].tolist()
        self.c_blk = (blk_at[cs] >= 0).tolist()
        self.c_g0, self.c_g1 = g0[cs].tolist(), g1[cs].tolist()
        self.c_enter = enter[cs].tolist()
        self.co = offsets(J[cs] - 1)
        self.busy = busy.tolist()


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


class _NoChunk:
    k0 = k1 = 0


_NO_CHUNK = _NoChunk()


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

    def pack(self) -> tuple:
        return (self.req_id, self.prompt_len, self.num_computed, self.num_output, self.blocks,
                self.mm, self.intro_step, self.preempted, self.adopted)

    @classmethod
    def unpack(cls, t: tuple) -> Req:
        r = cls(t[0], t[1], t[2], t[4], t[5], t[6], t[8])
        r.num_output, r.preempted = t[3], t[7]
        return r


class _State:
    """Everything that changes per step; packed whole for a checkpoint."""

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
        # The fast path may take the next step: the batch holds, once each and with no hole,
        # exactly the ids the previous step gave a token count, none of them preempted or
        # with multimodal features.
        self.fast_ok = True
        # After a fast step the batch's requests' token counts are not written: they are
        # those of their rows in the previous step (see _sync).
        self.stale = False

    def pack(self) -> bytes:
        return pickle.dumps((self.pos, [r.pack() for r in self.requests.values()], self.slots,
                             self.encoder, self.ever_encoded, self.holders,
                             self.released_events, len(self.findings), self.flagged,
                             self.fast_ok), protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def unpack(cls, data: bytes, findings: list[Finding]) -> _State:
        (pos, reqs, slots, encoder, ever, holders, released, nfound, flagged,
         fast_ok) = pickle.loads(data)
        s = cls()
        s.pos, s.slots, s.encoder, s.ever_encoded, s.holders = pos, slots, encoder, ever, holders
        s.requests = {t[0]: Req.unpack(t) for t in reqs}
        s.released_events, s.flagged, s.fast_ok = released, flagged, fast_ok
        s.findings = findings[:nfound]
        return s


class ShadowWorker:
    """The shadow worker over one engine of a trace. `step()` applies the next recorded step;
    `finish()` adds what only the end of the trace tells (state never freed).

    Most steps of a long run change little: the batch stays, a few requests come and go, a few
    get blocks. Those steps take a fast path that touches only what changes, from columns a
    chunk of steps at a time prepares with numpy; any step that could report more than a shared
    block or an output mismatch, or whose batch is not as the fast path expects, takes the full
    path, which follows `_update_states` row by row."""

    def __init__(self, engine, strict_order: bool = False, checkpoint_every: int = 256) -> None:
        self.engine = engine.name
        m = self.manifest = engine.manifest
        self.block_size = (m.get("engine") or {}).get("block_size")
        self.mid_stream = bool(m.get("attached_mid_stream"))
        self.strict_order = strict_order
        self.checkpoint_every = max(1, checkpoint_every)
        st = engine.read("steps", _COLUMNS["steps"]).sort_by([("step", "ascending")])
        step_col = np.asarray(st.column("step").to_numpy(), dtype=np.int64)
        uniq, first = np.unique(step_col, return_index=True)
        self.steps: list[int] = uniq.tolist()
        self._t_ns: list = st.column("t_ns").take(pa.array(first)).to_pylist() \
            if first.size else []
        del st
        ids = self._ids = _Ids()
        self._sc = _Scheduled(engine, ids, uniq)
        self._mo = _Outputs(engine, ids, uniq)
        t = {name: _Table(engine.read(name, _COLUMNS[name]), ids, uniq)
             for name in ("requests", "mm_inputs", "finished", "preempted", "freed_mm")}
        fe = engine.read("finish_events", _COLUMNS["finish_events"]).sort_by(
            [("step", "ascending")])
        self._t = t
        upd = np.asarray(engine.read("updates", ["step"]).column("step").to_numpy(),
                         dtype=np.int64)
        self._updated = np.isin(uniq, upd)
        # finish events in step order: the scheduler frees the blocks at the event, so from
        # the next step on they may belong to someone else
        self._events = sorted(zip(fe.column("step").to_pylist(), fe.column("req_id").to_pylist(),
                                  fe.column("t_ns").to_pylist()),
                              key=lambda e: (e[0], e[2] or 0))
        self._event_steps = [e[0] for e in self._events]
        self._event_steps_np = np.asarray(self._event_steps, dtype=np.int64)
        self._first_seen: np.ndarray | None = None
        self._chunks: dict[int, _Chunk] = {}
        self._chunk_at = _NO_CHUNK
        self.s = _State()
        # the findings of the furthest position reached: every checkpoint's are a prefix
        self._reach = (0, self.s.findings)
        self._every = self.checkpoint_every
        self._checkpoints: dict[int, bytes] = {}
        self._cp_keys: list[int] = []
        self._cp_bytes = 0
        self._store(0)
        self._finished = False

    # -- stepping ---------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.s.pos >= len(self.steps)

    @property
    def findings(self) -> list[Finding]:
        return self.s.findings

    @property
    def finished(self) -> bool:
        """finish() has reported the end-of-trace findings (undone by going back)."""
        return self._finished

    def run(self, until: int | None = None, progress: Callable[[int, int], None] | None = None,
            cancel: Callable[[], bool] | None = None) -> bool:
        """Apply steps up to index `until` (exclusive; default all, then finish()); False if
        cancelled. A checkpoint already taken on the way is restored instead of stepping."""
        end = len(self.steps) if until is None else min(until, len(self.steps))
        total = end
        if self._jump(end) and progress is not None and self.s.pos == end:
            progress(end, total)
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
            self._restore(self._cp_keys[bisect_right(self._cp_keys, pos) - 1])
        self._jump(pos)
        while self.s.pos < pos:
            self.step()

    def _jump(self, end: int) -> bool:
        """Restore the last checkpoint at or before `end` if it is well ahead."""
        i = bisect_right(self._cp_keys, end) - 1
        if i >= 0 and self._cp_keys[i] >= self.s.pos + JUMP_STEPS and not self._finished:
            self._restore(self._cp_keys[i])
            return True
        return False

    def _restore(self, at: int) -> None:
        self.s = _State.unpack(self._checkpoints[at], self._reach[1])
        self._finished = False

    def _store(self, at: int) -> None:
        self._sync()
        data = self.s.pack()
        self._checkpoints[at] = data
        insort(self._cp_keys, at)
        self._cp_bytes += len(data)
        while self._cp_bytes > CHECKPOINT_BUDGET and len(self._cp_keys) > 2:
            self._every *= 2
            for k in [k for k in self._cp_keys if k % self._every]:
                self._cp_bytes -= len(self._checkpoints.pop(k))
            self._cp_keys = sorted(self._checkpoints)

    def _report(self, inv: str, step: int, req_id: str | None, details: str) -> None:
        self.s.findings.append(KINDS[inv].finding(step, req_id, details, self.engine))

    def _chunk(self, k: int) -> _Chunk:
        k0 = k - k % CHUNK_STEPS
        ch = self._chunks.get(k0)
        if ch is None:
            if len(self._chunks) >= 2:
                self._chunks.pop(next(iter(self._chunks)))
            ch = self._chunks[k0] = _Chunk(self, k0, min(len(self.steps), k0 + CHUNK_STEPS))
        self._chunk_at = ch
        return ch

    def step(self) -> list[Finding]:
        """Apply the next recorded step, in _update_states' order; returns its findings."""
        s = self.s
        before = len(s.findings)
        if s.fast_ok:
            k = s.pos
            ch = self._chunk_at
            if not ch.k0 <= k < ch.k1:
                ch = self._chunk(k)
            if not ch.slow[k - ch.k0] and self._fast(ch, k - ch.k0, before):
                return self._stepped(before)
        self._slow(before)
        return self._stepped(before)

    def _stepped(self, before: int) -> list[Finding]:
        s = self.s
        s.pos += 1
        if s.pos > self._reach[0]:
            self._reach = (s.pos, s.findings)
        if s.pos % self._every == 0 and s.pos not in self._checkpoints:
            self._store(s.pos)
        return s.findings[before:]

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

    def _fast(self, ch: _Chunk, j: int, before: int) -> bool:
        """The step in the common case (see _Chunk and _State.fast_ok): the same state the full
        path reaches, touching only what changes. False, having changed nothing, when a request
        entering the batch is not one it can take."""
        s = self.s
        if ch.busy[j]:
            reqs = s.requests
            ca, cb = ch.co[j], ch.co[j + 1]
            for x in range(ca, cb):
                if ch.c_enter[x]:
                    r = reqs.get(ch.c_rid[x])
                    if r is None or r.preempted or r.mm:
                        return False
            slots = s.slots
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
            a, b = ch.lo[j], ch.lo[j + 1]
            for x in range(a, b):
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
            to_add: list[str] = []  # new requests, then cached ones entering the batch
            enter_add: list[str] = []
            grants: list[tuple] = []
            step = self.steps[s.pos]
            flat, goff = ch.flat, ch.goff
            for x in range(ca, cb):
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
        elif s.released_events < ch.upto[j]:
            self._release_upto(ch.upto[j])
        if ch.out[j] or (self.strict_order and ch.upd[j]):
            self._outputs(self.steps[s.pos], list(s.slots), before)
        s.stale = True
        return True

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
            for g, group in enumerate(blocks):
                for b in group:
                    held = holders.get((g, b))
                    if held is None:
                        holders[(g, b)] = {rid}
                    else:
                        held.add(rid)

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

    def _rows(self, k: int) -> dict[str, list]:
        """Step index k's scheduled rows as columns of Python values, nulls as None."""
        sc = self._sc
        lo, hi = int(sc.lo[k]), int(sc.hi[k])
        ids = self._ids.ids
        return {
            "req_id": [ids[c] for c in sc.code[lo:hi].tolist()],
            "kind": [_KIND_NAME[x] for x in sc.kind[lo:hi].tolist()],
            "num_scheduled_tokens": [v if ok else None for v, ok in zip(
                sc.nst[lo:hi].tolist(), sc.nst_ok[lo:hi].tolist())],
            "num_computed_tokens": sc.nct[lo:hi].tolist(),
            "num_output_tokens": [v if ok else None for v, ok in zip(
                sc.nout[lo:hi].tolist(), sc.nout_ok[lo:hi].tolist())],
            "new_block_ids": sc.blk.get(sc.blk.at(lo, hi)),
            "encoder_inputs": sc.enc.get(sc.enc.at(lo, hi)),
        }

    def _known(self, rid, now: set) -> bool:
        """Introduced, adopted or freed before: in an earlier step (a scheduled row of any kind
        but an unknown one, or a finished id), or earlier in this one (`now`)."""
        if rid in now:
            return True
        if self._first_seen is None:
            sc, fin = self._sc, self._t["finished"]
            first = np.full(max(1, len(self._ids.ids)), np.iinfo(np.int64).max, np.int64)
            for lo, hi, code, keep in ((sc.lo, sc.hi, sc.code, sc.kind != OTHER),
                                       (fin.lo, fin.hi, fin.code, None)):
                cnt = hi - lo
                k = np.repeat(np.arange(cnt.size), cnt)
                start = np.concatenate([[0], np.cumsum(cnt)[:-1]]) if cnt.size else cnt
                rows = np.arange(int(cnt.sum())) - np.repeat(start, cnt) + np.repeat(lo, cnt)
                if keep is not None:
                    m = keep[rows]
                    rows, k = rows[m], k[m]
                np.minimum.at(first, np.asarray(code)[rows].astype(np.int64), k)
            self._first_seen = first
        c = self._ids.code.get(rid)
        return c is not None and int(self._first_seen[c]) < self.s.pos

    def _slow(self, before: int) -> None:
        """The step row by row, as _update_states applies it."""
        self._sync()
        s, t = self.s, self._t
        step = self.steps[s.pos]
        sc = self._rows(s.pos)
        rows = range(len(sc["req_id"]))
        known_now: set = set()
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
            known_now.add(rid)
            if req is not None:
                self._release(rid, req)
            self._remove(rid)
        # encoder outputs freed
        fm = t["freed_mm"].cols
        for i in t["freed_mm"].rows(step):
            s.encoder.pop(fm["mm_hash"][i], None)
        # blocks the scheduler took back: preempted in this step, finished before it
        pc_ = t["preempted"].cols
        for i in t["preempted"].rows(step):
            req = s.requests.get(pc_["req_id"][i])
            if req is not None:
                req.preempted = True
                self._release(req.req_id, req)
        self._release_events(step)
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
            known_now.add(rid)
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
                if not (self.mid_stream and not self._known(rid, known_now)):
                    if rid not in s.flagged:
                        self._report("worker.unknown_cached", step, rid,
                                     "never introduced as new, or already freed")
                    s.flagged.add(rid)
                req = Req(rid, None, computed, [], [], step, adopted=True)
                s.requests[rid] = req
                known_now.add(rid)
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

        self._encoder(step, sc, enc_rows, nst)
        batch = [r for r in s.slots if r is not None]
        members = set(batch)
        for rid in nst:
            if rid not in members:
                self._report("worker.unknown_scheduled", step, rid,
                             f"{nst[rid]} token(s) scheduled; the worker computes none")
        self._outputs(step, batch, before)
        # the fast path's precondition, for the next step (see _State.fast_ok)
        counted = [r for r, n in zip(sc["req_id"], sc["num_scheduled_tokens"]) if n is not None]
        s.fast_ok = (len(members) == len(s.slots) and members == set(counted)
                     and all(r is not None and not r.preempted and not r.mm
                             for r in map(s.requests.get, s.slots)))

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
            shared_by_group: dict[int, int] = {}
            example = None
            for g, group in enumerate(blocks):
                for b in group:
                    if b == 0:  # the null block: a placeholder many tables carry
                        continue
                    held = holders.get((g, b))
                    if not held or (len(held) == 1 and rid in held):
                        continue
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
            for g, group in enumerate(blocks):
                for b in group:
                    held = holders.get((g, b))
                    if held is None:
                        holders[(g, b)] = {rid}
                    else:
                        held.add(rid)
            this_step[rid] = kind

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
                if ev_t is None or self._t_ns[i] > ev_t:
                    due = self.steps[i]
                    break
            if due is None or last is None:
                continue
            self._report("worker.never_freed", due, rid,
                         f"finished at step {ev_step}; its id never reached the worker in "
                         f"finished_req_ids, so its state stays cached")
        return self.s.findings[before:]

    # -- display ----------------------------------------------------------------------------
    def state(self) -> dict:
        """The worker's state before step index `pos`, as plain data."""
        self._sync()
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
