"""outputs.index_mismatch on the real scheduler: a model output whose req_id_to_index swaps two
requests (update_from_output then hands each the other's token) is recorded and found; a clean
run records no map at all (it is req_ids enumerated)."""

from __future__ import annotations

from vllm_contract.recorder import attach
from vllm_contract.rig import scenarios
from vllm_contract.rig.harness import Harness
from vllm_contract.trace import open_trace

from checking import findings, hits


def _run(tiny_model, trace, swap_at: int | None):
    s = scenarios.SCENARIOS["chunked_prefill"]
    h = Harness(tiny_model, s.config)
    swapped = []
    with attach(h.scheduler, trace, writer="thread"):
        recorded = h.scheduler.update_from_output
        calls = {"n": 0}

        def update(so, mro, *a, **kw):
            ids = mro.req_ids
            if swap_at is not None and calls["n"] >= swap_at and not swapped and len(ids) >= 2:
                mro.req_id_to_index = {**mro.req_id_to_index, ids[0]: 1, ids[1]: 0}
                swapped.append((calls["n"], ids[0], ids[1]))
            calls["n"] += 1
            return recorded(so, mro, *a, **kw)

        h.scheduler.update_from_output = update
        s.drive(h)
    return swapped


def test_a_swapped_index_map_is_found(tiny_model, tmp_path):
    swapped = _run(tiny_model, tmp_path, swap_at=3)
    assert swapped, "the break never applied: the test proves nothing"
    ((step, a, b),) = swapped  # one schedule() per update here: call n is step n
    report = findings(tmp_path)
    assert sorted(hits(report, "outputs.index_mismatch")) == sorted([(step, a), (step, b)])
    (f, _) = [f for f in report.findings if f.invariant == "outputs.index_mismatch"]
    assert f.severity == "error"


def test_a_clean_run_keeps_no_map(tiny_model, tmp_path):
    assert _run(tiny_model, tmp_path, swap_at=None) == []
    (e,) = open_trace(tmp_path).engines
    assert "req_id_to_index" not in e.read("extra_fields").column("field").to_pylist()
    assert hits(findings(tmp_path), "outputs.index_mismatch") == []
