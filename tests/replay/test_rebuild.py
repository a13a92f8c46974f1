"""Rebuilt SchedulerOutputs equal, step by step, what the real scheduler returned: for every clean
harness scenario (one batch and two in flight) and a real engine; and what a trace cannot give
back is named in the notes, never guessed."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

import tinytrace
from vllm_contract.recorder import attach
from vllm_contract.replay.worker import canonical
from vllm_contract.replay.worker.rebuild import rebuild
from vllm_contract.rig import scenarios
from vllm_contract.rig.engine import demo_workload, scheduler_of
from vllm_contract.trace import open_trace

SMALL = [n for n in scenarios.SCENARIOS if n != "long_run"]
# Two batches in flight where the overlap changes what the output carries: drafts (placeholder
# -1 tokens) and structured output (has_structured_output_requests is set only there).
OVERLAPPED = ["spec_decode", "structured_output", "mixed"]


@pytest.fixture(scope="module")
def recorded(tiny_model, tmp_path_factory):
    """(live canonical forms, engine trace) of a scenario, each run once for the module."""
    runs: dict = {}

    def get(name: str, batch_queue: int = 1):
        if (name, batch_queue) not in runs:
            d = tmp_path_factory.mktemp(f"{name}-{batch_queue}")
            live = []
            scenarios.run(name, tiny_model, d, batch_queue=batch_queue,
                          on_schedule=lambda so: live.append(canonical.from_live(so)))
            runs[name, batch_queue] = (live, d)
        live, d = runs[name, batch_queue]
        return live, open_trace(d).engines[0]

    return get


def _assert_rebuilt_equals_live(engine, live: list[dict]):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    rebuilt = rebuild(engine)
    steps = list(rebuilt)
    assert [s for s, _ in steps] == list(range(len(live)))
    for (step, so), want in zip(steps, live):
        assert type(so) is SchedulerOutput and type(so.scheduled_cached_reqs) is CachedRequestData
        assert isinstance(so.finished_req_ids, set)
        assert isinstance(so.scheduled_cached_reqs.resumed_req_ids, set)
        for r in so.scheduled_new_reqs:
            assert type(r) is NewRequestData and type(r.sampling_params) is SamplingParams
            assert isinstance(r.block_ids, tuple)
        assert canonical.from_live(so) == want, f"step {step} differs"
    # A clean recording by the installed vLLM: nothing is missing, opaque or guessed. (An
    # engine used before, as the shared one is in the full suite, may still owe its worker
    # finished ids: the recording then begins mid-stream, and says so.)
    if engine.manifest.get("attached_mid_stream"):
        assert [n.split(":")[0] for n in rebuilt.notes] == ["recorded from mid-stream"]
    else:
        assert rebuilt.notes == [] and rebuilt.message() is None
    return steps


@pytest.mark.parametrize("name,batch_queue", [(n, 1) for n in SMALL] + [
    (n, 2) for n in OVERLAPPED])
def test_rebuilt_scenario_equals_live(name, batch_queue, recorded):
    live, engine = recorded(name, batch_queue)
    steps = _assert_rebuilt_equals_live(engine, live)
    if name == "structured_output":
        # parameter objects come back with the state the engine gave them, enums as enums
        from vllm.sampling_params import RequestOutputKind

        sp = next(r.sampling_params for _, so in steps for r in so.scheduled_new_reqs
                  if r.sampling_params.structured_outputs is not None)
        assert sp.structured_outputs._backend == "xgrammar"
        assert sp.output_kind is RequestOutputKind.CUMULATIVE
        assert isinstance(sp._all_stop_token_ids, set)
    if name == "encoder_lookalike":
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

        feats = [f for _, so in steps for r in so.scheduled_new_reqs for f in r.mm_features]
        assert feats and all(type(f) is MultiModalFeatureSpec
                             and type(f.mm_position) is PlaceholderRange for f in feats)


def test_rebuilt_engine_run_equals_live(cpu_llm, tmp_path):
    sched = scheduler_of(cpu_llm)
    live = []
    original = sched.schedule

    def schedule(*a, **kw):
        out = original(*a, **kw)
        live.append(canonical.from_live(out))  # before the worker can mutate anything
        return out

    sched.schedule = schedule
    try:
        with attach(sched, tmp_path):
            demo_workload(cpu_llm)  # chunked prefill, preemption, aborts, seeded sampling
    finally:
        del sched.schedule
    steps = _assert_rebuilt_equals_live(open_trace(tmp_path).engines[0], live)
    assert len(steps) > 100
    # preemption happened: the rebuild saw resumed requests and whole replacement tables
    assert any(so.scheduled_cached_reqs.resumed_req_ids for _, so in steps)


def _edit_manifest(src, dst, edit) -> object:
    shutil.copytree(src.root, dst)  # the whole trace: an engine's tables lie beside its home
    (engine,) = open_trace(dst).engines
    path = engine.dir / "manifest.json"
    m = json.loads(path.read_text())
    edit(m["fields"])
    path.write_text(json.dumps(m))
    return open_trace(dst).engines[0]


def test_fields_either_side_lacks_are_named_once(recorded, tmp_path):
    live, engine = recorded("id_reuse")

    def edit(fields):
        # as if recorded by a vLLM with a field this one lacks, and without one it has
        fields["SchedulerOutput"].append("skip_drafts")
        fields["NewRequestData"].remove("replay_start")

    edited = _edit_manifest(engine, tmp_path / "edited", edit)
    rebuilt = rebuild(edited)
    steps = list(rebuilt)
    notes = rebuilt.notes
    assert [n for n in notes if "skip_drafts" in n] == [
        f"SchedulerOutput: recorded by vLLM {_installed()} with field(s) skip_drafts that the "
        f"installed vLLM {_installed()} lacks: left out"]
    assert len([n for n in notes if "replay_start" in n]) == 1
    assert "replay_start" in rebuilt.message() and "skip_drafts" in rebuilt.message()
    # the lacking field keeps the installed default, which here is what was recorded
    assert all(r.replay_start == 0 for _, so in steps for r in so.scheduled_new_reqs)
    assert [canonical.from_live(so) for _, so in steps] == live


def _installed() -> str:
    import vllm

    return vllm.__version__


def test_opaque_and_unknown_values_become_none_with_a_note(tmp_path):
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    fields = {c.__name__: [f.name for f in dataclasses.fields(c)]
              for c in (SchedulerOutput, NewRequestData, CachedRequestData)}
    sp = {"__type__": "SamplingParams", "max_tokens": 3, "temperature": 0.0,
          "logit_bias": {"__dict__": [[7, 1.5]]}, "output_kind": "RequestOutputKind.DELTA"}
    opaque = json.dumps({"__opaque__": "vllm.distributed.SomeConnectorMetadata", "size": 99})
    tinytrace.write(tmp_path, {
        "steps": tinytrace.steps(2, total_num_scheduled_tokens=4, num_new=lambda i: 1 - i,
                                 preempted_is_null=False, invalid_spec_is_null=True,
                                 cached_new_token_ids_len=0, num_common_prefix_blocks=[],
                                 has_structured_output_requests=False,
                                 pending_structured_output_tokens=False,
                                 has_sync_kv_loads=False, num_spec_tokens_to_schedule=0),
        "scheduled": [
            {"step": 0, "req_id": "r", "kind": "new", "pos": 0, "resumed": False,
             "num_scheduled_tokens": 4, "num_computed_tokens": 0, "new_block_ids": [[1]]},
            {"step": 1, "req_id": "r", "kind": "cached", "pos": 0, "resumed": False,
             "num_scheduled_tokens": 4, "num_computed_tokens": 4, "num_output_tokens": 1}],
        "requests": [{"step": 0, "req_id": "r", "pos": 0, "prompt_token_ids": [1, 2, 3, 4],
                      "prompt_len": 4, "sampling_params": json.dumps(sp),
                      "prompt_embeds": opaque.replace("SomeConnectorMetadata", "Tensor"),
                      "replay_start": 0}],
        "extra_fields": [{"step": 1, "owner": "SchedulerOutput", "field": "kv_connector_metadata",
                          "value_json": opaque},
                         {"step": 1, "owner": "SchedulerOutput", "field": "ec_manager_metadata",
                          "value_json": json.dumps({"__type__": "NotOurs", "x": 1})}],
    }, fields=fields, vllm_version=_installed())
    rebuilt = rebuild(open_trace(tmp_path).engines[0])
    (_, first), (_, second) = list(rebuilt)
    r = first.scheduled_new_reqs[0]
    assert r.prompt_embeds is None and r.block_ids == ([1],)
    assert r.sampling_params.logit_bias == {7: 1.5}  # int keys back, not strings
    assert r.sampling_params.output_kind.name == "DELTA"
    assert r.sampling_params.n == 1  # the installed default, noted below
    assert second.kv_connector_metadata is None and second.ec_manager_metadata is None
    assert second.preempted_req_ids == set() and second.num_invalid_spec_tokens is None
    for line in [
            "NewRequestData.prompt_embeds: opaque in the trace (vllm.distributed.Tensor): set "
            "to None (at 1 step, first 0)",
            "SchedulerOutput.kv_connector_metadata: opaque in the trace "
            "(vllm.distributed.SomeConnectorMetadata): set to None (at 1 step, first 1)",
            "SchedulerOutput.ec_manager_metadata: opaque in the trace (NotOurs): set to None "
            "(at 1 step, first 1)"]:
        assert line in rebuilt.notes
    assert any(n.startswith("SamplingParams.n: not in the trace: left at the installed "
                            "default (1)") for n in rebuilt.notes)


def test_steps_a_trace_cannot_give_back_are_named_as_runs(tmp_path):
    """Dropped and quarantined steps are named in runs of consecutive steps (vLLM-free)."""
    from vllm_contract.replay.worker.rebuild import trace_notes

    tinytrace.write(tmp_path, {
        "steps": tinytrace.steps(12),
        "malformed_steps": [{"step": s, "stage": "schedule", "error": "bad", "plain_json": "{}"}
                            for s in (11, 9, 10, 9)]
        + [{"step": 2, "stage": "update", "error": "bad", "plain_json": "{}"}],
    }, dropped_steps=[[3, 5], [7, 7]])
    notes = trace_notes(open_trace(tmp_path).engines[0])
    assert notes[0].endswith("(dropped or pruned while recording): 3-5, 7; not rebuilt")
    assert notes[1].endswith("(table malformed_steps): 9-11; not rebuilt")
