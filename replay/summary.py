"""`info`: what a trace holds, and whether it can be trusted, as plain data."""

from __future__ import annotations

import pyarrow.compute as pc

from vllm_contract import schema
from vllm_contract.replay.trace import Trace


def engine_summary(e) -> dict:
    m = e.manifest
    tables = {t: e.read(t) for t in schema.TABLE_NAMES}
    steps, reqs = tables["steps"], tables["requests"]
    counts = {t: v.num_rows for t, v in tables.items()}
    integrity = []
    if not m.get("closed_cleanly"):
        integrity.append("not closed cleanly (recorder still running, or the process died)")
    for err in m.get("recorder_errors", []):
        integrity.append(f"recorder error: {err.get('error')}")
    for w in m.get("compaction_warnings", []):
        integrity.append(f"compacted from a damaged segment: {w}")
    pruned = {tuple(seg["steps"]) for seg in m.get("pruned_segments", []) if seg.get("steps")}
    for a, b in m.get("dropped_steps", []):
        why = ("deleted: the trace reached its size cap" if (a, b) in pruned
               else "the writer fell behind")
        integrity.append(f"steps {a}..{b} dropped ({why})")
    if m.get("attached_mid_stream"):
        integrity.append("attached mid-stream: the worker held requests introduced before step 0")
    if steps.num_rows:
        got = pc.min_max(steps["step"]).as_py()
        expected = got["max"] - got["min"] + 1
        if expected != steps.num_rows:
            integrity.append(f"{expected - steps.num_rows} step numbers missing between "
                             f"{got['min']} and {got['max']}")
    t = pc.min_max(steps["t_ns"]).as_py() if steps.num_rows else {"min": None, "max": None}
    return {
        "engine": e.name,
        "path": str(e.dir),
        "format_version": m.get("format_version"),
        "vllm_version": m.get("vllm_version"),
        "host": m.get("host"), "pid": m.get("pid"), "dp_rank": m.get("dp_rank"),
        "model": (m.get("engine") or {}).get("model"),
        "settings": m.get("engine"),
        "steps": steps.num_rows,
        "requests": len(set(reqs["req_id"].to_pylist())),
        "tokens_scheduled": pc.sum(steps["total_num_scheduled_tokens"]).as_py() or 0,
        "first_step_ns": t["min"], "last_step_ns": t["max"],
        "span_s": (t["max"] - t["min"]) / 1e9 if steps.num_rows else 0.0,
        "closed_cleanly": bool(m.get("closed_cleanly")),
        "rows": counts,
        "fields": m.get("fields"),
        "contract_drift": m.get("contract_drift"),
        "warnings": list(e.warnings),
        "integrity": integrity,
    }


def summary(trace: Trace) -> dict:
    return {"root": str(trace.root), "engines": [engine_summary(e) for e in trace.engines]}
