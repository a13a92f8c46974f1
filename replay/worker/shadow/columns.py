"""One engine's recorded tables as the shadow worker reads them: `scheduled` and `model_outputs`
(a row per request per step) as numpy columns in (step, pos) order, request ids as small ints
shared by every table, the smaller tables (a row per event) as Python lists, and each step
index's rows. Built once per worker (Columns); the chunk kernel (kernel.py) and the full path
(rules.py) read them."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vllm_contract import schema
from vllm_contract.replay.worker.shadow.segments import parts

# the tables the worker reads, and their columns; `scheduled` and `model_outputs` (a row per
# request per step) are kept as numpy columns, the others, a row per event, as Python lists
COLUMNS = {
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
KIND_CODE = {"new": NEW, "cached": CACHED, "resumed": RESUMED}
KIND_NAME = ("new", "cached", "resumed", None)


def _ints(column, fill: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An int column as values (nulls as `fill`) and validity."""
    valid = np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)
    values = _narrow(np.asarray(pc.fill_null(column, fill).to_numpy(), dtype=np.int64))
    return values, valid


def _narrow(a: np.ndarray) -> np.ndarray:
    if a.size and (a.min() < -(2 ** 31) or a.max() >= 2 ** 31):
        return a
    return a.astype(np.int32)


def _cat(pieces: list, dtype) -> np.ndarray:
    if not pieces:
        return np.zeros(0, dtype)
    if any(p.dtype == np.int64 for p in pieces):
        return np.concatenate([p.astype(np.int64) for p in pieces])
    return np.concatenate(pieces)


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


def spans(lo: np.ndarray, hi: np.ndarray, a: int, b: int):
    """Row numbers of step indices a..b-1, each row's step index relative to a, and each step's
    row count."""
    cnt = (hi[a:b] - lo[a:b]).astype(np.int64)
    rel = np.repeat(np.arange(b - a), cnt)
    start = np.cumsum(cnt) - cnt
    rows = np.arange(int(cnt.sum())) - np.repeat(start - lo[a:b], cnt)
    return rows.astype(np.int64), rel, cnt


class Ids:
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
    return [KIND_CODE.get(x, OTHER) for x in values]


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


class Sparse:
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


class Scheduled:
    """The `scheduled` table as numpy columns in (step, pos) order: id codes, kinds, the three
    token counts (nulls as 0 with validity where a null means something), and sparse block ids
    and encoder inputs; `lo`/`hi`: each step index's rows."""

    def __init__(self, engine, ids: Ids, steps: np.ndarray) -> None:
        cols: dict[str, list] = {k: [] for k in ("step", "pos", "pos_ok", "code", "kind", "nst",
                                                 "nst_ok", "nct", "nout", "nout_ok")}
        blk_rows, blk_vals, enc_rows, enc_vals = [], [], [], []
        n = 0
        for part in parts(engine, "scheduled", COLUMNS["scheduled"], ("req_id", "kind")):
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
        blk = Sparse(_cat(blk_rows, np.int64).astype(np.int64),
                      pa.chunked_array(blk_vals, sch.field("new_block_ids").type))
        enc = Sparse(_cat(enc_rows, np.int64).astype(np.int64),
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

    def rows(self, k: int, ids: list) -> dict[str, list]:
        """Step index k's rows as columns of Python values, nulls as None."""
        lo, hi = int(self.lo[k]), int(self.hi[k])
        return {
            "req_id": [ids[c] for c in self.code[lo:hi].tolist()],
            "kind": [KIND_NAME[x] for x in self.kind[lo:hi].tolist()],
            "num_scheduled_tokens": [v if ok else None for v, ok in zip(
                self.nst[lo:hi].tolist(), self.nst_ok[lo:hi].tolist())],
            "num_computed_tokens": self.nct[lo:hi].tolist(),
            "num_output_tokens": [v if ok else None for v, ok in zip(
                self.nout[lo:hi].tolist(), self.nout_ok[lo:hi].tolist())],
            "new_block_ids": self.blk.get(self.blk.at(lo, hi)),
            "encoder_inputs": self.enc.get(self.enc.at(lo, hi)),
        }


class Outputs:
    """`model_outputs`' request ids (codes) in (step, pos) order, with each step index's rows."""

    def __init__(self, engine, ids: Ids, steps: np.ndarray) -> None:
        st, pos, ok, code = [], [], [], []
        for part in parts(engine, "model_outputs", COLUMNS["model_outputs"], ("req_id",)):
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


class Table:
    """A small table's columns as Python lists, sorted by step (then pos), with each step's row
    range: no per-row dicts."""

    def __init__(self, table: pa.Table, ids: Ids | None = None,
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


class Columns:
    """Everything the worker reads of one engine, loaded once: its step numbers (in order,
    each once) and their times, the id codes, `scheduled` (sc) and `model_outputs` (mo), the
    small tables by name, which step indices have a model output, and the finish events."""

    def __init__(self, engine) -> None:
        st = engine.read("steps", COLUMNS["steps"]).sort_by([("step", "ascending")])
        step_col = np.asarray(st.column("step").to_numpy(), dtype=np.int64)
        uniq, first = np.unique(step_col, return_index=True)
        self.steps: list[int] = uniq.tolist()
        self.t_ns: list = st.column("t_ns").take(pa.array(first)).to_pylist() \
            if first.size else []
        del st
        ids = self.ids = Ids()
        self.sc = Scheduled(engine, ids, uniq)
        self.mo = Outputs(engine, ids, uniq)
        self.tables = {name: Table(engine.read(name, COLUMNS[name]), ids, uniq)
                       for name in ("requests", "mm_inputs", "finished", "preempted",
                                    "freed_mm")}
        fe = engine.read("finish_events", COLUMNS["finish_events"]).sort_by(
            [("step", "ascending")])
        upd = np.asarray(engine.read("updates", ["step"]).column("step").to_numpy(),
                         dtype=np.int64)
        self.updated = np.isin(uniq, upd)
        # finish events in step order: the scheduler frees the blocks at the event, so from
        # the next step on they may belong to someone else
        self.events = sorted(zip(fe.column("step").to_pylist(), fe.column("req_id").to_pylist(),
                                 fe.column("t_ns").to_pylist()),
                             key=lambda e: (e[0], e[2] or 0))
        self.event_steps = [e[0] for e in self.events]
        self.event_steps_np = np.asarray(self.event_steps, dtype=np.int64)
        self._first_seen: np.ndarray | None = None

    def first_seen(self) -> np.ndarray:
        """Per id code, the first step index it is scheduled at (a row of any kind but an
        unknown one) or finished at; worked out on first use."""
        if self._first_seen is None:
            sc, fin = self.sc, self.tables["finished"]
            first = np.full(max(1, len(self.ids.ids)), np.iinfo(np.int64).max, np.int64)
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
        return self._first_seen
