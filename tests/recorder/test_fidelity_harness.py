"""The trace of every harness scenario equals, field by field, what the real Scheduler produced."""

from __future__ import annotations

import pytest

from vllm_contract.replay.worker import canonical
from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios

SMALL = [n for n in scenarios.SCENARIOS if n != "long_run"]
# Two batches in flight (the AsyncScheduler's step path): updates come after the next
# schedule(), and the recorder pairs each with its schedule by identity.
OVERLAPPED = [(n, 2) for n in SMALL]


@pytest.mark.parametrize("name,batch_queue", [(n, 1) for n in SMALL] + OVERLAPPED)
def test_scenario_trace_is_lossless(name, batch_queue, tiny_model, tmp_path):
    live = []
    h = scenarios.run(name, tiny_model, tmp_path, on_schedule=lambda so: live.append(
        canonical.from_live(so)), batch_queue=batch_queue)
    assert (h.overlapped > 0) == (batch_queue > 1)
    trace = open_trace(tmp_path)
    assert len(trace.engines) == 1
    engine = trace.engines[0]
    assert engine.manifest["closed_cleanly"] is True
    recorded = list(canonical.from_trace(engine))
    assert [s for s, _ in recorded] == list(range(len(live)))
    for (step, got), want in zip(recorded, live):
        assert got == want, f"step {step} differs"

    # The model outputs recorded beside each step are exactly what the scheduler was fed.
    outputs = {}
    for row in engine.read("model_outputs").to_pylist():
        ids, toks = outputs.setdefault(row["step"], ([], []))
        ids.append(row["req_id"])
        toks.append(row["sampled_token_ids"])
    assert [outputs.get(i, ([], [])) for i in range(len(live))] == [
        (ids, toks) for ids, toks in h.model_outputs]


def _rows(engine, table):
    return engine.read(table).to_pylist()


def _window_block_handed_on(engine) -> bool:
    """A block of KV cache group 0 granted to one request and later to another while the first
    is still scheduled: freed behind its window (or its Mamba state) while it runs."""
    first: dict[int, str] = {}
    last_step: dict[str, int] = {}
    handed = []
    for r in _rows(engine, "scheduled"):
        last_step[r["req_id"]] = max(last_step.get(r["req_id"], -1), r["step"])
    for r in sorted(_rows(engine, "scheduled"), key=lambda r: r["step"]):
        for b in (r["new_block_ids"] or [[]])[0]:
            holder = first.get(b)
            if b and holder is not None and holder != r["req_id"]:
                handed.append((holder, r["step"]))
            if b:
                first[b] = r["req_id"]
    return any(last_step[holder] > step for holder, step in handed)


def _groups(engine) -> list[str]:
    return [g["kind"] for g in engine.manifest["engine"]["kv_cache_groups"]]


# What each scenario promises in docs/scenarios.md, checked on its trace.
SHOWS = {
    "hybrid_sliding": lambda e: _groups(e) == ["sliding_window", "full"]
        and _window_block_handed_on(e),
    "hybrid_mamba": lambda e: _groups(e) == ["mamba", "full"] and _window_block_handed_on(e)
        and any(r["kind"] == "new" and r["num_computed_tokens"] > 0 and 0 in r["new_block_ids"][0]
                for r in _rows(e, "scheduled"))
        and any(s["new_block_ids_to_zero"] for s in _rows(e, "steps")),
    "hybrid_mamba_plain": lambda e: _groups(e) == ["mamba", "full"] and all(
        len(r["new_block_ids"][0]) == (1 if r["kind"] in ("new", "resumed") else 0)
        for r in _rows(e, "scheduled") if r["new_block_ids"]),
    "chunked_prefill": lambda e: any(
        r["kind"] == "new" and r["num_scheduled_tokens"] < 200 for r in _rows(e, "scheduled")),
    "prefix_cache": lambda e: any(
        r["kind"] == "new" and r["num_computed_tokens"] >= 64 for r in _rows(e, "scheduled")),
    "preemption": lambda e: _rows(e, "preempted") and any(
        r["kind"] == "resumed" for r in _rows(e, "scheduled")),
    "aborts": lambda e: {("never-scheduled", "FINISHED_ABORTED"), ("a1", "FINISHED_ABORTED")} <= {
        (r["req_id"], r["reason"]) for r in _rows(e, "finish_events")}
        and "never-scheduled" in {r["req_id"] for r in _rows(e, "finished")}
        and "never-scheduled" not in {r["req_id"] for r in _rows(e, "requests")},
    "id_reuse": lambda e: ("x", 2) in {(r["req_id"], len([q for q in _rows(e, "requests")
                                                        if q["req_id"] == "x"]))
                                       for r in _rows(e, "requests")}
        and any(f["req_id"] == "x" and any(s["step"] == f["step"] and s["req_id"] == "x"
                                           and s["kind"] == "new" for s in _rows(e, "scheduled"))
                for f in _rows(e, "finished")),
    "spec_decode": lambda e: any(r["spec_token_ids"] for r in _rows(e, "scheduled")),
    "structured_output": lambda e: any(
        s["has_structured_output_requests"] for s in _rows(e, "steps")) and any(
        f["reason"] == "STOP" for f in _rows(e, "finish_events")),
    "encoder_lookalike": lambda e: any(r["encoder_inputs"] for r in _rows(e, "scheduled"))
        and _rows(e, "freed_mm") and all(q["mm_features"] for q in _rows(e, "requests")),
    "mixed": lambda e: _rows(e, "preempted") and any(
        r["reason"] == "FINISHED_ABORTED" for r in _rows(e, "finish_events")),
}


@pytest.mark.parametrize("name", SMALL)
def test_scenario_shows_what_it_is_named_for(name, tiny_model, tmp_path):
    scenarios.run(name, tiny_model, tmp_path)
    assert SHOWS[name](open_trace(tmp_path).engines[0])

