"""What-if runs on the real vLLM Scheduler (CPU build, no mocks): a recording re-run with half
the token budget drains in more steps, and with fewer KV blocks preempts more; the comparison's
numbers are checked against values computed here from the rows of the two traces (the
recording and the re-run recorded with --out), not from resim's own code."""

from __future__ import annotations

import math

import pytest

from vllm_contract import replay
from vllm_contract.rig import scenarios

BLOCKS, BUDGET = 90, 128


@pytest.fixture(scope="module")
def trace(tiny_model, tmp_path_factory):
    """Eight requests, all queued at the start: prefills take several steps of the budget,
    and their decodes grow into the KV cache of 90 blocks."""
    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness, HarnessConfig

    path = tmp_path_factory.mktemp("whatif") / "t"
    h = Harness(tiny_model, HarnessConfig(num_blocks=BLOCKS, max_num_batched_tokens=BUDGET))
    with attach(h.scheduler, path):
        for i in range(8):
            h.add(f"r{i}", scenarios.prompt(i, 100), max_tokens=60)
        h.run()
    return path


def _rows(path, table, columns=None):
    from vllm_contract.replay.worker.plan import pick_engine
    from vllm_contract.trace import open_trace

    return pick_engine(open_trace(path), None).read(table, columns).to_pylist()


def _nearest_rank(values, q):
    s = sorted(values)
    return s[math.ceil(q / 100 * len(s)) - 1]


def _expected(path, blocks, recording):
    """The measures from a trace's rows: steps up to the last that scheduled a token, rows of
    `preempted`, per-step token totals, first token's step counted from the request's
    arrival in both runs (the step after the one the recording's input log added it after),
    and the KV blocks in use (vLLM's kv_usage, recorded after each schedule(), times the
    usable blocks: all but the null block)."""
    arrival = {r["req_id"]: r["step"] + 1 for r in _rows(recording, "added", ["step", "req_id"])}
    steps = _rows(path, "steps", ["step", "total_num_scheduled_tokens", "kv_usage"])
    busy = [r["step"] for r in steps if r["total_num_scheduled_tokens"]]
    tokens = [r["total_num_scheduled_tokens"] for r in steps]
    first = {}
    for r in _rows(path, "model_outputs", ["step", "req_id", "sampled_token_ids"]):
        if r["sampled_token_ids"]:
            first[r["req_id"]] = min(first.get(r["req_id"], r["step"]), r["step"])
    return {"steps_to_drain": max(busy) - min(r["step"] for r in steps) + 1,
            "preemptions": len(_rows(path, "preempted")),
            "tokens_per_step_p50": _nearest_rank(tokens, 50),
            "tokens_per_step_p95": _nearest_rank(tokens, 95),
            "ttft_steps_p50": _nearest_rank([s - arrival[r] + 1 for r, s in first.items()], 50),
            "ttft_steps_p99": _nearest_rank([s - arrival[r] + 1 for r, s in first.items()], 99),
            "peak_kv_blocks": max(round(r["kv_usage"] * (blocks - 1)) for r in steps),
            "requests": len(first)}


def _whatif(trace, tmp_path, **overrides):
    run = replay.resim(trace, overrides=overrides, whatif=True, out=tmp_path / "rerun")
    list(run)
    return run.summary


def _check(side, expected):
    for k, v in expected.items():
        assert side[k] == v, (k, side[k], v)


def test_half_the_token_budget_drains_in_more_steps(trace, tmp_path):
    s = _whatif(trace, tmp_path, max_num_batched_tokens=BUDGET // 2)
    w = s.whatif
    _check(w.recording, _expected(trace, BLOCKS, trace))
    _check(w.rerun, _expected(tmp_path / "rerun", BLOCKS, trace))
    assert w.rerun["steps_to_drain"] > w.recording["steps_to_drain"]
    assert w.rerun["tokens_per_step_p95"] == BUDGET // 2 < w.recording["tokens_per_step_p95"]
    assert w.rerun["requests"] == w.recording["requests"] == 8  # every request finished
    assert w.notes == []
    # the same 60 tokens each: the re-run ran every request to its recorded length
    produced = [len(r["sampled_token_ids"]) for r in _rows(tmp_path / "rerun", "model_outputs")
                if r["sampled_token_ids"]]
    assert sum(produced) == 8 * 60
    assert w.rerun["errors"] == w.recording["errors"] == 0
    assert s.first is not None and s.first.step == 0  # divergence expected, still named
    assert s.as_dict()["whatif"]["rerun"]["steps_to_drain"] == w.rerun["steps_to_drain"]


def test_fewer_kv_blocks_preempt_more(trace, tmp_path):
    s = _whatif(trace, tmp_path, num_kv_blocks=BLOCKS // 2)
    w = s.whatif
    _check(w.recording, _expected(trace, BLOCKS, trace))
    _check(w.rerun, _expected(tmp_path / "rerun", BLOCKS // 2, trace))
    assert w.rerun["preemptions"] > w.recording["preemptions"]
    assert w.rerun["peak_kv_blocks"] <= BLOCKS // 2 - 1 < w.recording["peak_kv_blocks"]
    assert w.rerun["requests"] == 8 and w.notes == []


def test_without_overrides_the_what_if_run_measures_the_recording_again(trace):
    run = replay.resim(trace, whatif=True)
    list(run)
    w = run.summary.whatif
    assert w.rerun == w.recording
    assert run.summary.first is None  # the same feed: every step identical


def test_a_request_past_its_recorded_outputs_is_finished_at_its_recorded_length(
        tiny_model, tmp_path):
    """A trace that ends with its requests running: the what-if run, which goes on past the
    recording's last step, ends each one where its recorded outputs end."""
    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness, HarnessConfig

    h = Harness(tiny_model, HarnessConfig())
    with attach(h.scheduler, tmp_path / "cut"):
        for i in range(3):
            h.add(f"c{i}", scenarios.prompt(i, 20), max_tokens=30)
        for _ in range(6):
            h.step()
    recorded = {}
    for r in _rows(tmp_path / "cut", "model_outputs", ["req_id", "sampled_token_ids"]):
        recorded[r["req_id"]] = recorded.get(r["req_id"], 0) + len(r["sampled_token_ids"])
    s = _whatif(tmp_path / "cut", tmp_path, max_num_seqs=1)
    produced = {}
    for r in _rows(tmp_path / "rerun", "model_outputs", ["req_id", "sampled_token_ids"]):
        produced[r["req_id"]] = produced.get(r["req_id"], 0) + len(r["sampled_token_ids"])
    assert produced == recorded and set(recorded) == {"c0", "c1", "c2"}
    assert s.steps > 6  # past the recording's end: one request at a time
    fin = _rows(tmp_path / "rerun", "finish_events", ["req_id", "reason"])
    assert sorted((r["req_id"], r["reason"]) for r in fin) == [
        (f"c{i}", "FINISHED_ABORTED") for i in range(3)]
    assert s.whatif.rerun["requests"] == 3 and s.whatif.notes == []


@pytest.fixture(scope="module")
def late_trace(tiny_model, tmp_path_factory):
    """A request stamped as arriving before the first step but added to the scheduler only
    after step 2 (a frontend that held it): its arrival time and its add disagree."""
    import time

    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness, HarnessConfig

    path = tmp_path_factory.mktemp("late") / "t"
    h = Harness(tiny_model, HarnessConfig(max_num_batched_tokens=BUDGET))
    with attach(h.scheduler, path):
        stamped = time.time()
        h.add("r0", scenarios.prompt(0, 100), max_tokens=20)
        h.add("r1", scenarios.prompt(1, 100), max_tokens=20)
        for _ in range(3):
            h.step()
        h.add("late", scenarios.prompt(2, 40), max_tokens=8, arrival_time=stamped)
        h.run()
    return path


@pytest.mark.parametrize("arrivals, before_step", [("step", 3), ("time", 0)])
def test_arrivals_follow_the_add_or_the_recorded_arrival_time(late_trace, tmp_path, arrivals,
                                                              before_step):
    run = replay.resim(late_trace, overrides={"max_num_batched_tokens": BUDGET // 2},
                       whatif=True, out=tmp_path / "rerun", arrivals=arrivals)
    list(run)
    assert any(arrivals in n for n in run.notes if n.startswith("what-if run:"))
    # the re-run's own input log says where its scheduler got the request
    added = {r["req_id"]: r["step"] for r in _rows(tmp_path / "rerun", "added")}
    assert added["late"] == before_step - 1
    assert added["r0"] == added["r1"] == -1


def test_arrivals_by_time_need_a_what_if_run_and_an_input_log(late_trace, tmp_path):
    import resimkit

    from vllm_contract.errors import TraceError

    with pytest.raises(TraceError, match="--arrivals time is for a what-if run"):
        replay.resim(late_trace, arrivals="time")
    old = resimkit.without_input_log(late_trace, tmp_path / "old")
    with pytest.raises(TraceError, match="no input log"):
        replay.resim(old, whatif=True, overrides={"max_num_batched_tokens": 64},
                     arrivals="time")


def test_a_what_if_run_delivers_its_last_finished_ids_as_the_engine_does(trace, tmp_path):
    """EngineCore keeps stepping while finished ids wait to be sent (has_requests()): the
    re-run's last step carries them, so every finish reaches finished_req_ids."""
    _whatif(trace, tmp_path, max_num_batched_tokens=BUDGET // 2)
    finished = {r["req_id"] for r in _rows(tmp_path / "rerun", "finished")}
    assert finished == {f"r{i}" for i in range(8)}
    last = max(r["step"] for r in _rows(tmp_path / "rerun", "steps", ["step"]))
    assert any(r["step"] == last for r in _rows(tmp_path / "rerun", "finished"))


def test_a_what_if_run_of_some_of_the_requests_adds_only_those(trace, tmp_path):
    run = replay.resim(trace, whatif=True, keep={"r1", "r5"}, out=tmp_path / "some")
    list(run)
    added = {r["req_id"] for r in _rows(tmp_path / "some", "added")}
    assert added == {"r1", "r5"} and run.summary.whatif.rerun["requests"] == 2
    assert run.summary.recorded.errors == 0
    with pytest.raises(Exception, match="what-if run of a trace with an input log"):
        replay.resim(trace, keep={"r1"})


def test_one_options_object_or_its_fields_by_name_make_the_same_run(trace):
    """resim() takes a ResimOptions whole, or its fields by name over it; a what-if run is a
    class of its own over the stepping core, the strict re-run another."""
    from vllm_contract.replay.resim import Resim, ResimOptions, WhatIf

    opts = ResimOptions(overrides={"max_num_batched_tokens": BUDGET // 2}, whatif=True)
    whole = replay.resim(trace, opts)
    by_name = replay.resim(trace, overrides={"max_num_batched_tokens": BUDGET // 2},
                           whatif=True)
    assert isinstance(whole, WhatIf) and whole.options == by_name.options == opts
    assert whole.summary.as_dict() == by_name.summary.as_dict()
    strict = replay.resim(trace, opts, whatif=False, overrides=None)
    assert isinstance(strict, Resim) and strict.options.overrides is None
    assert strict.summary.identical
    with pytest.raises(TypeError, match="engine="):
        replay.resim(trace, "engine0")


def test_the_what_if_driver_uses_only_the_run_cores_public_face():
    import ast
    import inspect

    from vllm_contract.replay.resim import whatif_run

    tree = ast.parse(inspect.getsource(whatif_run.Driver))
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and (
        isinstance(n.value, ast.Name) and n.value.id == "rs"
        or isinstance(n.value, ast.Attribute) and n.value.attr == "rs")}
    assert "scheduler" in read and [a for a in read if a.startswith("_")] == []
