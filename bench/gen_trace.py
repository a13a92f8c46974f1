"""Generate a large, contract-respecting trace directly as Parquet segments (no vLLM needed).

`slots` requests run at once (default 64). Each slot runs requests back to back: a 32-token
prompt prefilled in one step, then one decode token per step for a length drawn from 50..300;
its finish event is in its last step, its id reaches the worker in the next step's
finished_req_ids, in which the slot's next request is introduced and reuses the freed blocks.
Block size 16; every slot owns its own range of block ids. The checker itself validates the
result as clean (bench/check_speed.py does, before timing).

Usage: python bench/gen_trace.py OUT [--steps 1000000] [--slots 64] [--chunk 20000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vllm_contract import schema

PROMPT, BLOCK, MIN_LEN, MAX_LEN = 32, 16, 50, 300
BLOCKS_PER_SLOT = (PROMPT + MAX_LEN) // BLOCK + 2


def plan(steps: int, slots: int, seed: int = 0):
    """Per slot: start step and length of each request, and global request numbers."""
    rng = np.random.default_rng(seed)
    starts, lengths, numbers = [], [], []
    next_number = 0
    for _ in range(slots):
        n = steps // MIN_LEN + 2
        ln = rng.integers(MIN_LEN, MAX_LEN + 1, size=n)
        st = np.concatenate([[0], np.cumsum(ln)[:-1]])
        keep = st < steps
        starts.append(st[keep])
        lengths.append(ln[keep])
        numbers.append(np.arange(next_number, next_number + keep.sum()))
        next_number += int(keep.sum())
    return starts, lengths, numbers


def _write(dirpath: Path, table: str, seq: int, columns: dict) -> None:
    sch = schema.schema(table)
    arrays = [columns[f.name] if f.name in columns else pa.nulls(len(columns["step"]), f.type)
              for f in sch]
    arrays = [a if isinstance(a, pa.Array) else pa.array(a, f.type) for a, f in zip(arrays, sch)]
    pq.write_table(pa.Table.from_arrays(arrays, schema=sch),
                   schema.table_dir(dirpath, table) / f"{seq:06d}.parquet",
                   compression="zstd")


def generate(out: Path, steps: int, slots: int, chunk: int, engine: str = "bench-0-dp0",
             fresh: bool = True, seed: int = 0) -> dict:
    """One engine's trace in format 2 (OUT/_engines/engine=ENGINE, OUT/<table>/engine=ENGINE);
    `fresh=False` adds the engine to what OUT holds (a fleet in one root)."""
    d = out / schema.ENGINES_DIR / f"{schema.ENGINE_DIR_PREFIX}{engine}"
    if fresh and out.exists():
        shutil.rmtree(out)
    d.mkdir(parents=True)
    for t in schema.TABLE_NAMES:
        schema.table_dir(d, t).mkdir(parents=True)
    starts, lengths, numbers = plan(steps, slots, seed)
    slot_ids = np.arange(slots)
    rows_written = 0
    for seq, s0 in enumerate(range(0, steps, chunk)):
        s1 = min(steps, s0 + chunk)
        step_axis = np.arange(s0, s1)
        # (slots, steps) grids, then flattened step-major: rows sorted by step, then slot
        idx = np.stack([np.searchsorted(starts[j], step_axis, side="right") - 1
                        for j in range(slots)])
        st = np.stack([starts[j][idx[j]] for j in range(slots)])
        ln = np.stack([lengths[j][idx[j]] for j in range(slots)])
        num = np.stack([numbers[j][idx[j]] for j in range(slots)])
        k = step_axis[None, :] - st  # 0 = prefill step
        is_new = k == 0
        nc = np.where(is_new, 0, PROMPT + k - 1)
        ns = np.where(is_new, PROMPT, 1)
        out_tokens = k
        base = (slot_ids * BLOCKS_PER_SLOT)[:, None]
        # a new request gets its prompt's blocks; a decode gets one when it crosses a boundary
        grows = (~is_new) & (nc % BLOCK == 0)
        T = lambda a: a.T.reshape(-1)  # noqa: E731 - step-major flattening
        kind = np.where(T(is_new), 0, 1).astype(np.int8)
        n = kind.size
        req_id = pa.array(np.char.add("r", T(num).astype(str)), pa.string())
        step_col = np.repeat(step_axis, slots)
        new_blocks = []
        b = T(base + np.zeros_like(k))
        g, isn, ncf = T(grows), T(is_new), T(nc)
        for i in range(n):  # only a few percent of rows carry blocks
            if isn[i]:
                new_blocks.append([[int(b[i]), int(b[i]) + 1]])
            elif g[i]:
                new_blocks.append([[int(b[i]) + int(ncf[i]) // BLOCK]])
            else:
                new_blocks.append(None)
        kinds = pa.DictionaryArray.from_arrays(pa.array(kind), pa.array(["new", "cached"])).cast(
            pa.string())
        pos = np.concatenate([np.arange(slots)] * (s1 - s0))
        _write(d, "scheduled", seq, {
            "step": step_col, "req_id": req_id, "kind": kinds, "pos": pos,
            "resumed": np.zeros(n, bool), "num_scheduled_tokens": T(ns),
            "num_computed_tokens": T(nc),
            "num_output_tokens": pa.array(np.where(T(is_new), 0, T(out_tokens))).cast(pa.int64()),
            "new_block_ids": pa.array(new_blocks, schema.schema("scheduled").field(
                "new_block_ids").type)})
        tokens = (T(num) * 7 + T(k)) % 500 + 3
        _write(d, "model_outputs", seq, {
            "step": step_col, "req_id": req_id, "pos": pos,
            "sampled_token_ids": pa.ListArray.from_arrays(
                pa.array(np.arange(n + 1, dtype=np.int32)), pa.array(tokens, pa.int64()))})
        # intros, finishes (event in the last step, delivery in the next), per chunk
        intro = T(is_new)
        last = T(k == ln - 1)
        delivered = T(is_new & (st > 0))
        prev_num = T(num - 1)  # the slot's previous request (numbers are consecutive per slot)
        _write(d, "requests", seq, {
            "step": step_col[intro], "req_id": req_id.filter(pa.array(intro)),
            "pos": pos[intro], "prompt_len": np.full(int(intro.sum()), PROMPT),
            "prompt_token_ids": pa.array([[3] * PROMPT] * int(intro.sum()),
                                         pa.list_(pa.int64()))})
        _write(d, "finish_events", seq, {
            "step": step_col[last], "req_id": req_id.filter(pa.array(last)),
            "reason": ["LENGTH"] * int(last.sum()), "source": ["update_from_output"] * int(
                last.sum())})
        _write(d, "finished", seq, {
            "step": step_col[delivered],
            "req_id": pa.array(np.char.add("r", prev_num[delivered].astype(str)), pa.string())})
        totals = (ns.sum(axis=0)).astype(np.int64)
        _write(d, "steps", seq, {
            "step": step_axis, "t_ns": step_axis * 1_000_000, "schedule_ns": np.full(s1 - s0, 1),
            "total_num_scheduled_tokens": totals, "num_new": is_new.sum(axis=0),
            "num_cached": (~is_new).sum(axis=0), "num_finished": (is_new & (st > 0)).sum(axis=0),
            "num_running": np.full(s1 - s0, slots), "num_waiting": np.zeros(s1 - s0, np.int64),
            "kv_usage": np.full(s1 - s0, 0.5), "preempted_is_null": np.zeros(s1 - s0, bool),
            "invalid_spec_is_null": np.ones(s1 - s0, bool),
            "cached_new_token_ids_len": np.zeros(s1 - s0, np.int64)})
        _write(d, "updates", seq, {"step": step_axis, "t_ns": step_axis * 1_000_000 + 1,
                                   "update_ns": np.full(s1 - s0, 1),
                                   "num_outputs": np.full(s1 - s0, slots)})
        for t in ("preempted", "freed_mm", "mm_inputs", "extra_fields"):
            _write(d, t, seq, {"step": np.zeros(0, np.int64)})
        rows_written += n
        print(f"\rgenerated {s1}/{steps} steps", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    manifest = {
        "format_version": schema.FORMAT_VERSION, "vllm_version": "synthetic", "host": "bench",
        "pid": 0, "dp_rank": 0, "started_at": 0, "ended_at": 1, "closed_cleanly": True,
        "recorder_errors": [], "steps_recorded": steps, "dropped_steps": [],
        "pickled_opaque": False, "attached_mid_stream": False,
        "engine": {"model": "synthetic", "block_size": BLOCK,
                   "num_kv_blocks": slots * BLOCKS_PER_SLOT,
                   "max_num_batched_tokens": slots * PROMPT, "max_num_seqs": slots,
                   "max_model_len": PROMPT + MAX_LEN + 16},
    }
    (d / schema.MANIFEST).write_text(json.dumps(manifest, indent=2))
    return {"steps": steps, "rows": rows_written}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=20_000)
    a = ap.parse_args()
    t0 = time.time()
    r = generate(a.out, a.steps, a.slots, a.chunk)
    print(f"{r['steps']} steps, {r['rows']} scheduled rows in {time.time() - t0:.1f} s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
