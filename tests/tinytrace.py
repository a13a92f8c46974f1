"""Tiny hand-built traces for the catalog's diff tests (in the style of Perfetto's): a few rows
per table, written by hand, in the real on-disk format, then read by the real reader and DuckDB.

These are look-alikes of what vLLM's scheduler records, named as such: they exist to pin each
invariant's SQL to exact rows. Whether the catalog is right about real vLLM is what the break
tests (tests/query/test_*_breaks.py) and the clean-run tests say."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from vllm_contract import schema

ENGINE = "engine=tiny"
# Engine settings of the look-alike: small enough to exceed by hand.
SETTINGS = {"model": "tiny", "block_size": 4, "num_kv_blocks": 16, "max_num_batched_tokens": 32,
            "max_num_seqs": 4, "max_model_len": 64, "dtype": "float32",
            "scheduler_class": "vllm.v1.core.sched.scheduler.Scheduler"}


def _fill(table: str, row: dict) -> dict:
    sch = schema.schema(table)
    unknown = set(row) - set(sch.names)
    assert not unknown, f"{table} has no column(s) {sorted(unknown)}"
    out = {name: row.get(name) for name in sch.names}
    if table in ("steps", "updates"):
        # a clock that orders calls as a one-batch engine makes them: schedule(), then update
        out.setdefault("t_ns", None)
        if out["t_ns"] is None:
            out["t_ns"] = row["step"] * 1000 + (500 if table == "updates" else 0)
        for dur in ("schedule_ns", "update_ns"):
            if dur in out and out[dur] is None:
                out[dur] = 1
    return out


def steps(n: int, **columns) -> list[dict]:
    """n rows of `steps` (0..n-1), each with `columns` as given (a callable gets the step)."""
    return [{"step": i, **{k: (v(i) if callable(v) else v) for k, v in columns.items()}}
            for i in range(n)]


# Rows of `requests` and `scheduled` in the shape most checks read (areas with a fixed prompt
# or decode pattern keep their own shorter makers).
def intro(step: int, rid: str, prompt_len: int, pos: int = 0) -> dict:
    return {"step": step, "req_id": rid, "pos": pos, "prompt_len": prompt_len}


def new(step: int, rid: str, computed: int, sched: int, blocks: list[int], pos: int = 0) -> dict:
    return {"step": step, "req_id": rid, "kind": "new", "pos": pos,
            "num_computed_tokens": computed, "num_scheduled_tokens": sched,
            "new_block_ids": [blocks]}


def cached(step: int, rid: str, computed: int, sched: int, blocks: list[int] | None = None,
           pos: int = 0, **more) -> dict:
    return {"step": step, "req_id": rid, "kind": "cached", "pos": pos,
            "num_computed_tokens": computed, "num_scheduled_tokens": sched,
            "new_block_ids": None if blocks is None else [blocks], **more}


def resumed(step: int, rid: str, computed: int, sched: int, blocks: list[int],
            pos: int = 0) -> dict:
    return {**cached(step, rid, computed, sched, blocks, pos), "kind": "resumed",
            "resumed": True}


def write(root: Path, tables: dict[str, list[dict]], engine: str = ENGINE,
          settings: dict | None = None, absent: tuple[str, ...] = ("transport",),
          **manifest) -> Path:
    """A one-engine trace under root/engine with these rows and a manifest of a clean close;
    every other table is recorded empty, except the `absent` ones, which the trace lacks (as a
    recording without the plugin's transport hooks lacks `transport`). `manifest` overrides the
    manifest's top-level keys. Returns root."""
    d = Path(root) / engine
    for table in schema.TABLE_NAMES:
        rows = [_fill(table, r) for r in tables.get(table, [])]
        (d / table).mkdir(parents=True, exist_ok=True)
        if rows or table not in absent:
            pq.write_table(pa.Table.from_pylist(rows, schema=schema.schema(table)),
                           d / table / "000000.parquet")
    unknown = set(tables) - set(schema.TABLE_NAMES)
    assert not unknown, f"no such table(s): {sorted(unknown)}"
    m = {"format_version": schema.FORMAT_VERSION, "closed_cleanly": True,
         "attached_mid_stream": False, "dropped_steps": [], "recorder_errors": [],
         "steps_recorded": len(tables.get("steps", [])), "vllm_version": "look-alike",
         "engine": {**SETTINGS, **(settings or {})}}
    m.update(manifest)
    (d / schema.MANIFEST).write_text(json.dumps(m))
    return Path(root)


def found(root: Path, invariant: str) -> list[tuple]:
    """(step, req_id, details) of each row the invariant's SQL returns over the trace, in the
    checker's order; a skipped check is an assertion error naming why."""
    from vllm_contract.replay.query import catalog, checker
    from vllm_contract.replay.query.gateway import Gateway

    with Gateway(root) as gw:
        report = checker.run(gw, checker.select(catalog.load(), [invariant]))
    assert invariant not in report.skipped, report.skipped[invariant]
    return [(f.step, f.req_id, f.message[len(f.title) + 2:]) for f in report.findings]
