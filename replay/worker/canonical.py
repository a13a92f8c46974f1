"""One canonical plain-data form of a SchedulerOutput, reachable from both ends:

- `from_live(so)`: from a live vLLM object (any object with the dataclass's attributes);
- `from_trace(trace)`: from the tables of a recorded trace, one dict per step.

Equality of the two, step by step, is what "the trace is lossless" means. Conventions: sets are
sorted lists, tuples are lists, objects are their plain JSON form (see vllm_contract.plain), and a
field without a column of its own that is None or empty is absent.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from typing import Any, Iterator

from vllm_contract.fields import CACHED_REQUESTS, NEW_REQUEST, SCHEDULER_OUTPUT
from vllm_contract.plain import to_plain

_EMPTY_NONE = ("mm_features",)  # stored as NULL when empty


def _extras(obj: Any, known: tuple[str, ...]) -> dict:
    out = {}
    for f in dataclasses.fields(obj):
        if f.name in known:
            continue
        v = getattr(obj, f.name)
        if v is None or (isinstance(v, (dict, list, set, tuple)) and not v):
            continue
        out[f.name] = to_plain(v)
    return out


def from_live(so: Any) -> dict:
    new = []
    for r in so.scheduled_new_reqs:
        d = {k: to_plain(getattr(r, k, None)) for k in NEW_REQUEST}
        for k in _EMPTY_NONE:
            d[k] = d[k] or None
        d["extra"] = _extras(r, NEW_REQUEST)
        new.append(d)
    cr = so.scheduled_cached_reqs
    out = {k: to_plain(getattr(so, k, None)) for k in SCHEDULER_OUTPUT if k not in
           ("scheduled_new_reqs", "scheduled_cached_reqs")}
    out["scheduled_new_reqs"] = new
    out["scheduled_cached_reqs"] = {k: to_plain(getattr(cr, k)) for k in CACHED_REQUESTS}
    out["scheduled_cached_reqs"]["extra"] = _extras(cr, CACHED_REQUESTS)
    out["extra"] = _extras(so, SCHEDULER_OUTPUT)
    return out


def _rows_by_step(table) -> dict[int, list[dict]]:
    by = defaultdict(list)
    for row in table.to_pylist():
        by[row["step"]].append(row)
    return by


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def from_trace(engine) -> Iterator[tuple[int, dict]]:
    """(step, canonical SchedulerOutput) for every step of one engine's trace."""
    steps = engine.read("steps").to_pylist()
    sched = _rows_by_step(engine.read("scheduled"))
    reqs = _rows_by_step(engine.read("requests"))
    fin = _rows_by_step(engine.read("finished"))
    pre = _rows_by_step(engine.read("preempted"))
    freed = _rows_by_step(engine.read("freed_mm"))
    extra = _rows_by_step(engine.read("extra_fields"))
    for st in steps:
        step = st["step"]
        rows = sched.get(step, [])
        new_rows = sorted((r for r in rows if r["kind"] == "new"), key=lambda r: r["pos"])
        cached = sorted((r for r in rows if r["kind"] in ("cached", "resumed")), key=lambda r: r["pos"])
        ex = extra.get(step, [])
        new = []
        intro = {r["pos"]: r for r in reqs.get(step, [])}
        for r in new_rows:
            q = intro[r["pos"]]
            new.append({
                "req_id": r["req_id"], "prompt_token_ids": q["prompt_token_ids"],
                "mm_features": _json(q["mm_features"]), "sampling_params": _json(q["sampling_params"]),
                "pooling_params": _json(q["pooling_params"]), "block_ids": r["new_block_ids"],
                "num_computed_tokens": r["num_computed_tokens"],
                "lora_request": _json(q["lora_request"]), "prompt_embeds": _json(q["prompt_embeds"]),
                "prompt_is_token_ids": q["prompt_is_token_ids"],
                "prefill_token_ids": q["prefill_token_ids"], "replay_start": q["replay_start"],
                "extra": {e["field"]: _json(e["value_json"]) for e in ex
                          if e["owner"] == "NewRequestData" and e["req_id"] == r["req_id"]},
            })

        def per_req(col: str) -> dict:
            return {r["req_id"]: r[col] for r in rows if r[col] is not None}

        cached_extra = {e["field"]: _json(e["value_json"]) for e in ex
                        if e["owner"] == "CachedRequestData"}
        n_tok = st["cached_new_token_ids_len"]
        new_token_ids = cached_extra.pop("new_token_ids", None) or [
            r["new_token_ids"] for r in cached[:n_tok]]
        preempted = None if st["preempted_is_null"] else sorted(r["req_id"] for r in pre.get(step, []))
        yield step, {
            "scheduled_new_reqs": new,
            "scheduled_cached_reqs": {
                "req_ids": [r["req_id"] for r in cached],
                "resumed_req_ids": sorted(r["req_id"] for r in rows if r["resumed"]),
                "new_token_ids": new_token_ids,
                "all_token_ids": per_req("all_token_ids"),
                "new_block_ids": [r["new_block_ids"] for r in cached],
                "num_computed_tokens": [r["num_computed_tokens"] for r in cached],
                "num_output_tokens": [r["num_output_tokens"] for r in cached],
                "extra": cached_extra,
            },
            "num_scheduled_tokens": per_req("num_scheduled_tokens"),
            "total_num_scheduled_tokens": st["total_num_scheduled_tokens"],
            "scheduled_spec_decode_tokens": per_req("spec_token_ids"),
            "scheduled_encoder_inputs": per_req("encoder_inputs"),
            "finished_req_ids": sorted(r["req_id"] for r in fin.get(step, [])),
            "free_encoder_mm_hashes": [r["mm_hash"] for r in sorted(freed.get(step, []),
                                                                    key=lambda r: r["pos"])],
            "preempted_req_ids": preempted,
            "has_structured_output_requests": st["has_structured_output_requests"],
            "pending_structured_output_tokens": st["pending_structured_output_tokens"],
            "num_invalid_spec_tokens": None if st["invalid_spec_is_null"] else per_req(
                "num_invalid_spec_tokens"),
            "has_sync_kv_loads": st["has_sync_kv_loads"],
            "num_spec_tokens_to_schedule": st["num_spec_tokens_to_schedule"],
            "num_common_prefix_blocks": st["num_common_prefix_blocks"],
            "new_block_ids_to_zero": st["new_block_ids_to_zero"],
            "extra": {e["field"]: _json(e["value_json"]) for e in ex if e["owner"] == "SchedulerOutput"},
        }
