"""The shadow worker: silent on every clean run, and at the right step and request on every
break of the real scheduler's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_contract.kinds import KINDS
from vllm_contract.replay.worker.shadow import ShadowModel, run_shadow
from vllm_contract.rig import breaks, scenarios
from vllm_contract.trace import open_trace

from checking import CLEAN, OVERLAPPED, patched

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
CLEAN_SAMPLES = ["mixed", "mixed-async", "spec-decode", "encoder-lookalike", "structured-output"]


def shadow(path):
    return run_shadow(open_trace(path))


def first(found):
    return (found[0].step, found[0].req_id) if found else None


@pytest.mark.parametrize("sample", CLEAN_SAMPLES)
def test_clean_samples_have_no_worker_findings(sample):
    assert shadow(SAMPLES / sample) == []


@pytest.mark.parametrize("name,batch_queue", [(n, 1) for n in CLEAN] + OVERLAPPED)
def test_clean_scenarios_have_no_worker_findings(name, batch_queue, tiny_model, tmp_path):
    h = scenarios.run(name, tiny_model, tmp_path, batch_queue=batch_queue)
    assert (h.overlapped > 0) == (batch_queue > 1)
    found = shadow(tmp_path)
    assert found == [], [f.message for f in found]


def test_long_run_has_no_worker_findings(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CONTRACT_LONG_REQS", "64")
    monkeypatch.setenv("VLLM_CONTRACT_LONG_STEPS", "600")
    scenarios.run("long_run", tiny_model, tmp_path)
    assert len(open_trace(tmp_path).read("finished")) > 64  # requests came and went
    assert shadow(tmp_path) == []


@pytest.mark.parametrize("sample,want", [
    ("broken-leak", ("worker.never_freed", 31, "p0")),
    ("broken-held-block", ("worker.block_shared", 0, "a1")),
    ("broken-unknown-cached", ("worker.unknown_scheduled", 0, "a3")),
])
def test_broken_samples_first_finding(sample, want):
    found = shadow(SAMPLES / sample)
    assert (found[0].invariant, found[0].step, found[0].req_id) == want
    assert all(f.severity == KINDS[f.invariant].severity for f in found)


def test_unknown_cached_follows_the_forgotten_request():
    found = shadow(SAMPLES / "broken-unknown-cached")
    assert [(f.invariant, f.step, f.req_id) for f in found] == [
        ("worker.unknown_scheduled", 0, "a3"), ("worker.unknown_cached", 1, "a3")]


def test_dropped_finished_id(tiny_model, tmp_path):
    """BREAKS' broken-leak: the id never arrives, so the state outlives the run."""
    _dropped.clear()
    patched(tiny_model, tmp_path, "preemption", _reporting(breaks.drop_finished_once()))
    found = shadow(tmp_path)
    dropped = _dropped[-1]
    assert [f.invariant for f in found] == ["worker.never_freed"]
    # reported at the step that should have carried the id
    assert (found[0].step, found[0].req_id) == dropped


_dropped: list = []


def _reporting(mutate):
    """What drop_finished_once dropped, seen in the output itself (not taken from its report)."""
    def wrapped(so, step):
        before = set(so.finished_req_ids)
        mutate(so, step)
        gone = before - set(so.finished_req_ids)
        if gone:
            _dropped.append((step, gone.pop()))
            return _dropped[-1]
    return wrapped


def test_block_handed_out_while_held(tiny_model, tmp_path):
    def wrapped(so, step):
        ids = [[list(g) for g in r.block_ids] for r in so.scheduled_new_reqs]
        mutate(so, step)
        for r, was in zip(so.scheduled_new_reqs, ids):
            if [list(g) for g in r.block_ids] != was:
                return step, r.req_id

    mutate = breaks.hand_out_held_block()
    broken = patched(tiny_model, tmp_path, "aborts", wrapped)
    found = shadow(tmp_path)
    assert first(found) == broken[0] and found[0].invariant == "worker.block_shared"


def test_forgotten_new_request(tiny_model, tmp_path):
    def wrapped(so, step):
        before = [r.req_id for r in so.scheduled_new_reqs]
        mutate(so, step)
        after = {r.req_id for r in so.scheduled_new_reqs}
        gone = [r for r in before if r not in after]
        return (step, gone[0]) if gone else None

    mutate = breaks.forget_new_request()
    broken = patched(tiny_model, tmp_path, "aborts", wrapped)
    found = shadow(tmp_path)
    assert first(found) == broken[0]
    assert [f.invariant for f in found[:2]] == ["worker.unknown_scheduled",
                                                "worker.unknown_cached"]
    assert found[1].req_id == broken[0][1] and found[1].step > broken[0][0]


def test_encoder_output_freed_between_chunks(tiny_model, tmp_path):
    broken = patched(tiny_model, tmp_path, "encoder_lookalike",
                     breaks.free_encoder_between_chunks())
    found = shadow(tmp_path)
    assert [(f.invariant, f.step, f.req_id) for f in found] == [
        ("worker.encoder_output_missing", *broken[0])]


def test_resumed_as_cached_appends_to_a_stale_table(tiny_model, tmp_path):
    broken = patched(tiny_model, tmp_path, "preemption", breaks.resume_as_cached())
    found = shadow(tmp_path)
    assert first(found) == broken[0] and found[0].invariant == "worker.stale_table_append"


def test_resumed_without_table(tiny_model, tmp_path):
    broken = patched(tiny_model, tmp_path, "preemption", breaks.resume_without_table())
    found = shadow(tmp_path)
    assert first(found) == broken[0] and found[0].invariant == "worker.resumed_without_table"


def test_lost_step_leaves_the_worker_consistent(tiny_model, tmp_path):
    """A step that never reaches the worker: the SchedulerOutputs the worker does get still
    agree with each other, and the recorded outputs with its batch."""
    patched(tiny_model, tmp_path, "aborts", breaks.lose_a_step(stall=40))
    assert shadow(tmp_path) == []


def test_mid_stream_trace_adopts_requests(tiny_model, tmp_path):
    """A trace cut to begin mid-run, marked attached: requests it never saw introduced are
    taken as held; unmarked, the same trace is a KeyError at their first step."""
    import json
    import shutil

    from checking import edit, edit_manifest

    scenarios.run("mixed", tiny_model, tmp_path / "t")
    tables = ["steps", "scheduled", "requests", "mm_inputs", "finished", "preempted",
              "freed_mm", "updates", "model_outputs", "finish_events"]
    for table in tables:
        edit(tmp_path / "t", table, lambda rows: [r for r in rows if r["step"] >= 6])
    shutil.copytree(tmp_path / "t", tmp_path / "plain")
    edit_manifest(tmp_path / "t", attached_mid_stream=True)
    assert shadow(tmp_path / "t") == []
    found = shadow(tmp_path / "plain")
    assert found and {f.invariant for f in found} <= {"worker.unknown_cached",
                                                      "worker.output_order"}
    assert min(f.step for f in found) == 6
    (e,) = open_trace(tmp_path / "t").engines
    assert json.loads((e.dir / "manifest.json").read_text())["attached_mid_stream"] is True


def test_state_is_plain_data_of_the_batch_and_tables():
    import json

    (e,) = open_trace(SAMPLES / "mixed").engines
    w = ShadowModel(e)
    w.run(until=3)
    st = w.state()
    json.dumps(st)
    assert st["position"] == 3 and st["batch"]
    assert set(st["batch"]) <= set(st["requests"])
    held = {b for r in st["requests"].values() for g, t in enumerate(r["block_ids"])
            for b in (f"{g}:{x}" for x in t)}
    assert set(st["block_holders"]) <= held
