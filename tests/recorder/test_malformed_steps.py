"""A malformed SchedulerOutput is recorded, not fatal: its step is quarantined whole
(`malformed_steps`), every other step lands as usual, and `check` reports it.

Real scheduler outputs from the harness (the real vLLM Scheduler), broken the ways contract
bugs break them just before the recorder takes them, and put back right after, so the
scheduler and the harness go on with the real objects."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_contract.recorder import attach
from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.rig import scenarios
from vllm_contract.rig.harness import Harness
from vllm_contract.trace import open_trace

SCENARIO = "preemption"  # new, cached and resumed requests, finished ids, in a few dozen steps


def _set(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    return lambda: setattr(obj, name, old)


def _cached(so):
    return so.scheduled_cached_reqs


# name -> (applies to this output?, break it and return how to undo it, must it be quarantined?)
# "Must" holds for both writers; the others may be storable as they are (a negative count is a
# contract error that the catalog reports, not a shape the tables cannot hold).
MUTATIONS = {
    "short_parallel_list": (lambda so: len(_cached(so).req_ids) > 0, lambda so: _set(
        _cached(so), "num_computed_tokens", list(_cached(so).num_computed_tokens)[:-1]), True),
    "long_parallel_list": (lambda so: len(_cached(so).req_ids) > 0, lambda so: _set(
        _cached(so), "num_output_tokens", list(_cached(so).num_output_tokens) + [7]), True),
    "none_for_a_list": (lambda so: True, lambda so: _set(_cached(so), "new_block_ids", None),
                        True),
    "wrong_element_type": (lambda so: len(_cached(so).req_ids) > 0, lambda so: _set(
        _cached(so), "num_computed_tokens", [str(n) for n in _cached(so).num_computed_tokens]),
        True),
    "huge_number": (lambda so: True, lambda so: _set(so, "total_num_scheduled_tokens", 2 ** 70),
                    True),
    "id_not_a_string": (lambda so: len(_cached(so).req_ids) > 0, lambda so: _set(
        _cached(so), "req_ids", [12345] + list(_cached(so).req_ids)[1:]), True),
    "negative_number": (lambda so: bool(so.num_scheduled_tokens), lambda so: _set(
        so, "num_scheduled_tokens", {**so.num_scheduled_tokens,
                                     next(iter(so.num_scheduled_tokens)): -5}), False),
    "set_for_a_list": (lambda so: len(_cached(so).req_ids) > 0, lambda so: _set(
        _cached(so), "req_ids", set(_cached(so).req_ids)), False),
    "missing_attribute": (lambda so: True, lambda so: _missing(so, "scheduled_spec_decode_tokens"),
                          False),
}


def _missing(obj, name):
    old = obj.__dict__.pop(name)
    return lambda: obj.__dict__.__setitem__(name, old)


def _record(tiny_model, trace, plan: dict[int, str], writer: str):
    """Run the scenario with the recorder on, breaking step n with plan[n] where it applies.
    Returns (schedule() calls, {step: mutation applied})."""
    s = scenarios.SCENARIOS[SCENARIO]
    h = Harness(tiny_model, s.config)
    real = h.scheduler.schedule
    calls = {"n": 0}
    applied: dict[int, str] = {}
    undo = []

    def broken(*a, **kw):
        so = real(*a, **kw)
        step = calls["n"]
        calls["n"] += 1
        name = plan.get(step)
        if name and MUTATIONS[name][0](so):
            undo.append(MUTATIONS[name][1](so))
            applied[step] = name
        return so

    h.scheduler.schedule = broken
    rec = attach(h.scheduler, trace, writer=writer, flush_steps=4)
    recorded = h.scheduler.schedule

    def restored(*a, **kw):
        so = recorded(*a, **kw)
        while undo:
            undo.pop()()
        return so

    h.scheduler.schedule = restored
    try:
        s.drive(h)
    finally:
        rec.close()
    return calls["n"], applied


def _assert_every_step_accounted_for(trace, calls: int, applied: dict[int, str]):
    (e,) = open_trace(trace).engines
    m = e.manifest
    assert m["recorder_errors"] == [] and m["closed_cleanly"], m["recorder_errors"]
    recorded = e.read("steps").column("step").to_pylist()
    mal = e.read("malformed_steps").to_pylist()
    quarantined = [r["step"] for r in mal if r["stage"] != "update"]
    assert len(set(recorded)) == len(recorded) and len(set(quarantined)) == len(quarantined)
    assert set(recorded) | set(quarantined) == set(range(calls))
    assert not set(recorded) & set(quarantined)
    # nothing valid is lost: only broken steps are quarantined, and each shape the tables
    # cannot hold is
    assert set(quarantined) <= set(applied), (quarantined, applied)
    must = {st for st, name in applied.items() if MUTATIONS[name][2]}
    assert must <= set(quarantined), (must, quarantined)
    assert m["steps_recorded"] == len(recorded)
    assert m.get("steps_malformed", 0) == len(quarantined)
    for r in mal:  # whole and one line
        assert json.loads(r["plain_json"]) and "\n" not in r["error"]
        # a quarantined step has no row in the step-keyed tables
        if r["stage"] != "update":
            assert r["step"] not in e.read("scheduled").column("step").to_pylist()
    with Gateway(trace) as gw:
        report = checker.run(gw, catalog.load())
    flagged = [(f.step, f.severity) for f in report.findings if f.invariant == "trace.malformed_step"]
    assert sorted(flagged) == [(st, "error") for st in sorted(quarantined)]
    assert "trace.missing_steps" not in {f.invariant for f in report.findings}
    return quarantined


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.dictionaries(st.integers(0, 40), st.sampled_from(sorted(MUTATIONS)),
                            min_size=1, max_size=4))
def test_a_malformed_step_is_quarantined_and_the_rest_recorded(plan, tiny_model, tmp_path_factory):
    trace = tmp_path_factory.mktemp("t")
    calls, applied = _record(tiny_model, trace, plan, "thread")
    _assert_every_step_accounted_for(trace, calls, applied)


def test_every_kind_of_break_with_the_writer_process(tiny_model, tmp_path):
    plan = {3 + 2 * i: name for i, name in enumerate(sorted(MUTATIONS))}
    calls, applied = _record(tiny_model, tmp_path, plan, "process")
    assert len(applied) >= 6, applied  # the plan reached the steps it meant to break
    quarantined = _assert_every_step_accounted_for(tmp_path, calls, applied)
    assert len(quarantined) >= 6
