"""The trace of every harness scenario equals, field by field, what the real Scheduler produced."""

from __future__ import annotations

import pytest

from vllm_contract.replay import canonical
from vllm_contract.replay.trace import open_trace
from vllm_contract.rig import scenarios

SMALL = [n for n in scenarios.SCENARIOS if n != "long_run"]


@pytest.mark.parametrize("name", SMALL)
def test_scenario_trace_is_lossless(name, tiny_model, tmp_path):
    live = []
    h = scenarios.run(name, tiny_model, tmp_path, on_schedule=lambda so: live.append(
        canonical.from_live(so)))
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
