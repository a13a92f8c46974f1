"""The pytest plugin on real vLLM Schedulers, through pytester (each run a fresh pytest process:
the plugin patches vLLM's Scheduler class, which must not leak into this session). A clean
workload passes and leaves its trace; a Scheduler subclass that leaks a finished id (rig/breaks.py
as rig/bugged.py writes it) fails with the finding in the report and the JUnit XML; the baseline
absorbs it and says when an entry is not hit; a test that drives the scheduler as no engine does
gets notes, not failures; the plugin off changes nothing; xdist is refused in one line."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from vllm_contract.rig import bugged
from vllm_contract.trace import open_trace

pytest_plugins = ["pytester"]

WORKLOAD = '''
import vllm.v1.core.sched.scheduler as sched_mod

from vllm_contract.rig import tiny_model
from vllm_contract.rig.harness import Harness, HarnessConfig


def harness(cls=None):
    """A real vLLM Scheduler (of class `cls` in the stock one's place), as a test builds it."""
    stock = sched_mod.Scheduler
    if cls is not None:
        sched_mod.Scheduler = cls
    try:
        return Harness(str(tiny_model.build()), HarnessConfig(max_num_seqs=2,
                                                              max_num_batched_tokens=64))
    finally:
        sched_mod.Scheduler = stock


def run(cls=None, requests=4):
    h = harness(cls)
    for i in range(requests):
        h.add(f"r{i}", [1 + i, 2, 3, 4, 5, 6, 7, 8], max_tokens=4 + i)
    while h.busy:
        h.step()
    return h
'''

TESTS = '''
from workload import harness, run
from bugs import DropFinishedOnce


def test_clean():
    run()


def test_leaky():
    assert run(DropFinishedOnce).scheduler.broken  # the break applied


def test_driven_by_hand():
    """schedule() twice without an update, and no update after the last: no engine does it."""
    h = harness()
    h.add("a", [1, 2, 3, 4, 5, 6, 7, 8], max_tokens=4)
    h.scheduler.schedule()
    h.scheduler.schedule()


def test_hand_built_output():
    """A ModelRunnerOutput for a request the step did not schedule, as no worker sends."""
    from vllm.v1.outputs import ModelRunnerOutput

    h = harness()
    h.add("a", [1, 2, 3, 4, 5, 6, 7, 8], max_tokens=4)
    for _ in range(3):
        so = h.scheduler.schedule()
        ids = list(so.num_scheduled_tokens) + ["ghost"]
        h.scheduler.update_from_output(so, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[5] for _ in ids]))
'''


@pytest.fixture
def suite(pytester, tiny_model):
    pytester.makepyfile(workload=WORKLOAD, bugs=bugged.module_source(["drop_finished_once"]),
                        test_sched=TESTS)
    return pytester


def _run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args, timeout=600)


def test_clean_passes_and_a_leak_fails_with_its_finding(suite):
    r = _run(suite, "--vllm-contract", "--junitxml=junit.xml")
    r.assert_outcomes(passed=3, failed=1)
    out = r.stdout.str()
    assert "FAILED test_sched.py::test_leaky" in out
    assert "contract finding(s) in this test's scheduler steps" in out
    assert "finished.leaked" in out
    trace = suite.path / ".vllm-contract" / "test_sched.py" / "test_clean" / "scheduler-0"
    (engine,) = open_trace(trace).engines  # a trace that opens: one engine, the scheduler
    assert len(engine.read("steps")) > 0
    assert "4 test(s) checked, 4 scheduler(s)" in out
    assert "findings: finished.leaked 1" in out
    # JUnit: the finding as a property of the failing test
    cases = {c.get("name"): c for c in ET.parse(suite.path / "junit.xml").iter("testcase")}
    props = [(p.get("name"), p.get("value")) for p in cases["test_leaky"].iter("property")]
    assert any(n == "vllm_contract_finding" and v.startswith("finished.leaked") for n, v in props)
    # the hand-driven tests: notes, not failures
    assert "PASSED test_sched.py::test_driven_by_hand" in out
    assert "2 step(s) without update_from_output() (the first at step 0; the last step" in out
    assert "PASSED test_sched.py::test_hand_built_output" in out
    assert ("note: outputs.ids_mismatch at step 0 (ghost) taken for the test's driving (a model "
            "output for ghost, which the step did not schedule)") in out
    # the shadow worker beside the catalog: the leaked id's state is never freed there
    r = _run(suite, "--vllm-contract", "--vllm-contract-worker", "shadow", "-k", "leaky")
    r.assert_outcomes(failed=1, deselected=3)
    assert "worker.never_freed" in r.stdout.str()


def test_the_baseline_absorbs_a_finding_and_says_when_an_entry_is_not_hit(suite):
    r = _run(suite, "--vllm-contract", "--vllm-contract-baseline", "base.json",
             "--vllm-contract-update-baseline")
    r.assert_outcomes(passed=4)
    assert "baseline written" in r.stdout.str()
    text = (suite.path / "base.json").read_text()
    assert '"test_sched.py::test_leaky"' in text and '"finished.leaked"' in text
    assert '"step"' not in text  # keyed by test and invariant, never by step
    r = _run(suite, "--vllm-contract", "--vllm-contract-baseline", "base.json")
    r.assert_outcomes(passed=4)
    assert "in the baseline: error finished.leaked" in r.stdout.str()
    # an entry for a finding that no longer happens
    data = text.replace('"test_sched.py::test_leaky"', '"test_sched.py::test_clean"')
    (suite.path / "stale.json").write_text(data)
    r = _run(suite, "--vllm-contract", "--vllm-contract-baseline", "stale.json")
    r.assert_outcomes(passed=3, failed=1)
    assert "baseline entry not hit: test_sched.py::test_clean finished.leaked" in r.stdout.str()
    assert r.ret == 1
    r = _run(suite, "--vllm-contract", "--vllm-contract-baseline", "base.json",
             "--vllm-contract-strict", "-k", "clean")
    r.assert_outcomes(passed=1, deselected=3)
    assert r.ret == 1 and "baseline entry not hit" in r.stdout.str()


def test_off_changes_nothing_and_xdist_is_refused(suite):
    r = _run(suite)
    r.assert_outcomes(passed=4)
    out = r.stdout.str()
    assert "test(s) checked" not in out and "Captured vllm-contract" not in out
    assert not (suite.path / ".vllm-contract").exists()
    r = _run(suite, "--vllm-contract", "-n", "2")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "--vllm-contract does not run under pytest-xdist (-n)" in r.stderr.str()
    r = _run(suite, "--vllm-contract", "--vllm-contract-baseline", "nope.json")
    assert r.ret == pytest.ExitCode.USAGE_ERROR and "does not exist" in r.stderr.str()


def test_the_projects_scenarios_run_clean_under_the_plugin(pytester, tiny_model, monkeypatch):
    """Every scenario of the rig (the real Scheduler on each workload the suite records) under
    the plugin: no finding fails it (long_run at a tenth of its size)."""
    from vllm_contract.rig import scenarios

    monkeypatch.setenv("VLLM_CONTRACT_LONG_REQS", "128")
    monkeypatch.setenv("VLLM_CONTRACT_LONG_STEPS", "1000")
    pytester.makepyfile(test_scenarios=f'''
import pytest
from vllm_contract.rig import scenarios, tiny_model

@pytest.mark.parametrize("name", {sorted(scenarios.SCENARIOS)!r})
def test_scenario(name, tmp_path):
    scenarios.run(name, str(tiny_model.build()), tmp_path / "own")
''')
    r = _run(pytester, "--vllm-contract", "--vllm-contract-fail-on", "warning")
    r.assert_outcomes(passed=len(scenarios.SCENARIOS))
    assert f"{len(scenarios.SCENARIOS)} test(s) checked" in r.stdout.str()
