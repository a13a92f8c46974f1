"""Running the catalog over a trace, and breaking real recordings the way a scheduler bug would:
shared by the query and CLI tests.

Breaks come two ways. "patch": the real Scheduler runs and its SchedulerOutput is altered right
after schedule() returns, before the recorder sees it (the bug is in the scheduler, the trace is
real). "edit": a clean recorded trace is compacted and one table or the manifest is rewritten
(for breaks that would derail the scheduler itself, or that concern the recorder)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import fleetkit

from vllm_contract import schema
from vllm_contract.recorder.compact import compact
from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.rig import scenarios
from vllm_contract.trace import open_trace

CLEAN = [n for n in scenarios.SCENARIOS if n != "long_run"]
# and with two batches in flight (the AsyncScheduler's step path)
OVERLAPPED = [(n, 2) for n in CLEAN]


def findings(path, only=None):
    with Gateway(path) as gw:
        invs = checker.select(catalog.load(), only)
        report = checker.run(gw, invs)
    fleetkit.keep(Path(path))  # for the Spark test: the same catalog there, on every trace
    return report


def serious(report):
    return [f for f in report.findings if f.severity in ("error", "warning")]


def hits(report, invariant):
    return [(f.step, f.req_id) for f in report.findings if f.invariant == invariant]



def patched(tiny_model, tmp_path, name, mutate, **writer):
    """Run scenario `name`, letting mutate(so, step) break each SchedulerOutput; returns the
    list of (step, req_id) that mutate reported breaking."""
    broken = []
    state = {"step": 0}

    def on_schedule(so):
        hit = mutate(so, state["step"])
        if hit:
            broken.append(hit)
        state["step"] += 1

    scenarios.run(name, tiny_model, tmp_path, on_schedule=on_schedule, **writer)
    assert broken, "the patch never applied: the test proves nothing"
    return broken


def edit(path: Path, table: str, fn) -> None:
    """Rewrite one table of a (single-engine) trace: rows -> fn(rows)."""
    t = open_trace(path)
    compact(t)
    (e,) = t.engines
    rows = fn(e.read(table).to_pylist())
    for p in schema.table_dir(e.dir, table).glob("*.parquet"):
        p.unlink()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.schema(table)),
                   schema.table_dir(e.dir, table) / "000000.parquet")


def alter_one_token(src: Path, dst: Path) -> tuple[int, str, list[int], list[int]]:
    """A copy of the trace at `src` in `dst` with one recorded token changed (an edit, named as
    such): the first token of the middle model output that has any. Returns (step, req_id,
    the recorded tokens, the altered ones)."""
    shutil.copytree(src, dst)
    (e,) = open_trace(dst).engines
    rows = [r for r in e.read("model_outputs").to_pylist() if r["sampled_token_ids"]]
    target = rows[len(rows) // 2]
    step, rid, orig = target["step"], target["req_id"], target["sampled_token_ids"]
    altered = [(orig[0] + 1) % 512]

    def change(rows):
        for r in rows:
            if r["step"] == step and r["req_id"] == rid:
                r["sampled_token_ids"] = altered
        return rows

    edit(dst, "model_outputs", change)
    return step, rid, orig, altered


def edit_manifest(path: Path, **changes) -> None:
    (e,) = open_trace(path).engines
    m = json.loads((e.dir / "manifest.json").read_text())
    for k, v in changes.items():
        if k in m.get("engine", {}):
            m["engine"][k] = v
        else:
            m[k] = v
    (e.dir / "manifest.json").write_text(json.dumps(m))


def cached_ids(so):
    return list(so.scheduled_cached_reqs.req_ids)

