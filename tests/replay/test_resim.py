"""`resim` on the real vLLM Scheduler (CPU build, no mocks): every rig scenario recorded anew
and re-run from its trace comes out decision-identical at every step; a scheduler bug recorded
as a Scheduler subclass is named at its first step when re-run with the stock class, and
vanishes when re-run with the subclass ("confirm a fix")."""

from __future__ import annotations


import pytest

from vllm_contract import replay
from vllm_contract.errors import TraceError
from vllm_contract.rig import scenarios

import resimkit

# encoder_lookalike stamps encoder inputs onto the outputs after schedule(): not the
# scheduler's decisions, so not the re-run's; long_run is a benchmark's size
SYNC = sorted(set(scenarios.SCENARIOS) - {"encoder_lookalike", "long_run"})
IN_FLIGHT = ["mixed", "spec_decode", "preemption"]

@pytest.fixture(scope="module")
def recorded(tiny_model, tmp_path_factory):
    cache: dict = {}

    def get(name: str, batch_queue: int = 1):
        if (name, batch_queue) not in cache:
            path = tmp_path_factory.mktemp(f"{name}-{batch_queue}")
            scenarios.run(name, tiny_model, path, batch_queue=batch_queue)
            cache[(name, batch_queue)] = path
        return cache[(name, batch_queue)]

    return get


@pytest.fixture(scope="module")
def bug_trace(tiny_model, tmp_path_factory):
    """The aborts scenario recorded with DropFinishedOnce in place of vLLM's Scheduler."""
    path = tmp_path_factory.mktemp("bug")
    with resimkit.bug_scheduler(tmp_path_factory.mktemp("bugmod"), "resim_bug_sched") as bug:
        h = resimkit.record_with(bug, "aborts", tiny_model, path)
        (hit,) = h.scheduler.broken  # (schedule() call, the id dropped)
        yield path, hit[1]


def _all(trace, **kw):
    run = replay.resim(trace, **kw)
    results = list(run)
    return run.summary, results


@pytest.mark.parametrize("name", SYNC)
def test_every_scenario_re_runs_identically(recorded, name):
    summary, results = _all(recorded(name))
    assert summary.steps == len(results) > 0
    assert summary.first is None, summary.first.difference
    assert summary.identical_steps == summary.steps  # 100 %
    assert [r.step for r in results] == list(range(len(results)))
    assert summary.scheduler_class == "vllm.v1.core.sched.scheduler:Scheduler"
    assert summary.notes[0].startswith("inputs from the recorded input log")


@pytest.mark.parametrize("name", SYNC)
def test_a_trace_without_an_input_log_re_runs_from_derived_inputs(recorded, name, tmp_path):
    """Format 2 had no input log: the calls are derived from the outputs, as identical."""
    old = resimkit.without_input_log(recorded(name), tmp_path / "old")
    summary, results = _all(old)
    assert summary.first is None, summary.first.difference
    assert summary.identical_steps == summary.steps == len(results) > 0
    assert summary.notes[0].startswith("inputs derived from the recorded outputs")


@pytest.mark.parametrize("name", IN_FLIGHT)
def test_two_batches_in_flight_re_run_identically(recorded, name):
    summary, results = _all(recorded(name, 2))
    assert summary.first is None, summary.first.difference
    assert summary.identical_steps == summary.steps == len(results) > 0
    assert summary.scheduler_class.endswith(":AsyncScheduler")


def test_a_bug_recorded_with_a_subclass_is_named_by_the_stock_scheduler(bug_trace):
    path, dropped = bug_trace
    summary, results = _all(path)
    first = summary.first
    assert first is not None and not summary.identical
    assert first.field == "finished_req_ids" and first.request == dropped
    assert first.difference == (f"step {first.step:,}: the re-run's finished_req_ids has "
                                f"{dropped}; the recording's does not")
    assert all(r.identical for r in results if r.step < first.step)
    assert summary.identical_steps < summary.steps
    assert any("recorded with resim_bug_sched.DropFinishedOnce" in n for n in summary.notes)


def test_the_subclass_re_runs_its_own_recording_identically(bug_trace):
    path, _ = bug_trace
    summary, _ = _all(path, scheduler_cls="resim_bug_sched:DropFinishedOnce")
    assert summary.first is None and summary.identical_steps == summary.steps > 0


def test_a_smaller_token_budget_diverges_in_words(recorded):
    summary, results = _all(recorded("mixed"), overrides={"max_num_batched_tokens": 64})
    f = summary.first
    assert f.step == 0 and f.field == "num_scheduled_tokens"
    assert f.difference.startswith(f"step 0: the recording scheduled {f.request} for ")
    assert "; the re-run scheduled it for " in f.difference
    assert summary.steps == len(results)  # ran to the end, past the divergence


def test_unusable_input_is_one_line(recorded, tmp_path):
    trace = recorded("id_reuse")
    with pytest.raises(TraceError, match="not importable"):
        replay.resim(trace, scheduler_cls="no_such_module:Scheduler")
    with pytest.raises(TraceError, match="not a subclass of vLLM's Scheduler"):
        replay.resim(trace, scheduler_cls="collections:OrderedDict")
    with pytest.raises(TraceError, match="unknown setting 'num_gpu_blockz'"):
        replay.resim(trace, overrides={"num_gpu_blockz": 4})
    with pytest.raises(TraceError, match="does not exist here"):
        replay.resim(trace, overrides={"model": str(tmp_path / "gone")})


def test_redacted_prompts_with_prefix_caching_re_run_from_salted_block_hashes(
        tiny_model, tmp_path):
    """Prefix-cache hits depend on the prompt tokens, which a redacted trace lacks: its input
    log has each prompt block's hash, salted, and the re-run's requests carry those."""
    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness

    s = scenarios.SCENARIOS["prefix_cache"]
    h = Harness(tiny_model, s.config)
    with attach(h.scheduler, tmp_path / "t", redact_prompts=True):
        s.drive(h)
    summary, results = _all(tmp_path / "t")
    assert summary.first is None, summary.first.difference
    assert summary.identical_steps == summary.steps == len(results) > 0
    hits = [r for r in replay.resim(tmp_path / "t").inputs.plains.items()
            if any(n["num_computed_tokens"] for n in r[1]["scheduled_new_reqs"])]
    assert hits  # the scenario's cache hits were re-run, not absent
    old = resimkit.without_input_log(tmp_path / "t", tmp_path / "old")
    with pytest.raises(TraceError, match="redacted prompts and prefix caching"):
        replay.resim(old)


def test_the_priority_policy_re_runs_from_the_logged_priorities(tiny_model, tmp_path):
    """Priorities and arrival times are inputs only the log has: a priority-policy engine
    whose queue order they decide re-runs identically, and without the log is refused."""
    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness, HarnessConfig

    h = Harness(tiny_model, HarnessConfig(policy="priority", max_num_seqs=2, num_blocks=64))
    with attach(h.scheduler, tmp_path / "t"):
        for i in range(6):
            h.add(f"p{i}", scenarios.prompt(i, 30 + 9 * i), max_tokens=6, priority=(i * 5) % 3)
        for _ in range(3):
            h.step()
        h.add("urgent", scenarios.prompt(9, 40), max_tokens=4, priority=-1)
        h.run()
    summary, results = _all(tmp_path / "t")
    assert summary.first is None, summary.first.difference
    assert summary.identical_steps == summary.steps == len(results) > 0
    first = [n["req_id"] for _, p in replay.resim(tmp_path / "t").inputs.plains.items()
             for n in p["scheduled_new_reqs"]]
    assert first[:2] != ["p0", "p1"]  # the priorities, not the order of adds, decided
    old = resimkit.without_input_log(tmp_path / "t", tmp_path / "old")
    with pytest.raises(TraceError, match="priority scheduling policy"):
        replay.resim(old)


def test_redacted_prompts_re_run_identically_without_prefix_caching(tiny_model, tmp_path):
    """Without prefix caching no decision reads a prompt token: the re-run makes up tokens of
    the recorded lengths and compares everything but the prompts."""
    from dataclasses import replace

    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness

    s = scenarios.SCENARIOS["preemption"]
    h = Harness(tiny_model, replace(s.config, enable_prefix_caching=False))
    with attach(h.scheduler, tmp_path / "t", redact_prompts=True):
        s.drive(h)
    summary, results = _all(tmp_path / "t")
    assert summary.first is None, summary.first.difference
    assert summary.identical_steps == summary.steps == len(results) > 0


def test_a_scheduler_that_raises_ends_the_run_with_a_result(recorded, bug_trace):
    summary, results = _all(recorded("aborts"),
                            scheduler_cls="resim_bug_sched:RaisesOnThirdSchedule")
    last = results[-1]
    assert last.step == 2 and last.field == "exception" and summary.stopped
    assert last.difference == ("step 2: the re-run's scheduler raised RuntimeError in "
                               "schedule: broken across lines")
    assert summary.first == last and summary.recorded_steps > summary.steps


@pytest.mark.parametrize("batch_queue", [1, 2])
def test_the_recording_is_read_forward_across_many_segments(tiny_model, tmp_path, monkeypatch,
                                                            batch_queue):
    """resim reads the recording a segment at a time as the re-run goes, in windows of
    steps: with tiny segments and windows, updates written a flush after their step (batches
    in flight) and a compacted copy, still identical at every step."""
    from vllm_contract.recorder.compact import compact
    from vllm_contract.replay.resim import inputs
    from vllm_contract.trace import open_trace

    monkeypatch.setattr(inputs, "WINDOW", 8)
    path = tmp_path / "t"
    scenarios.run("mixed", tiny_model, path, batch_queue=batch_queue, segment_bytes=4096,
                  flush_steps=4)
    (e,) = open_trace(path).engines
    assert len(e.segments("scheduled")) > 5 and len(e.read("steps")) > 8 * 5
    resimkit.assert_re_runs_identically(path)
    compact(open_trace(path))
    assert all(p.suffix == ".parquet" for p in open_trace(path).engines[0].segments("scheduled"))
    resimkit.assert_re_runs_identically(path)


def test_the_run_freezes_the_heap_while_stepping_and_gives_the_collector_back(recorded):
    import gc

    run = replay.resim(recorded("aborts"))
    during = [gc.get_freeze_count() for _ in run]
    assert during and min(during) > 0  # vLLM's modules and the scheduler out of its reach
    assert gc.get_freeze_count() == 0
    stopped = replay.resim(recorded("aborts"))
    next(iter(stopped))  # a run left half-way: its generator dropped, so closed
    gc.collect()
    assert gc.get_freeze_count() == 0
