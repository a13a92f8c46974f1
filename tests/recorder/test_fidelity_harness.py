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


# What each scenario promises in docs/scenarios.md, checked on its trace.
SHOWS = {
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

