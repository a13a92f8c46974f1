"""The pytest plugin on real vLLM Schedulers, through pytester (each run a fresh pytest process:
the plugin patches vLLM's Scheduler class, which must not leak into this session). A clean
workload passes and leaves its trace; a Scheduler subclass that leaks a finished id (rig/breaks.py
as rig/bugged.py writes it) fails with the finding in the report and the JUnit XML; a test that
pokes the scheduler's state gets a warning that stands, failing it under `--vllm-contract-fail-on
warning`; the baseline absorbs findings and says when an entry is not hit; a test that drives the
scheduler as no engine does gets notes, not failures; what a fixture's teardown does with a
scheduler fails the teardown; the ini switches and `--vllm-contract-fail-on never` work; the
plugin off changes nothing; xdist, a missing vLLM and a baseline update without a file are
refused in one line; the rig's scenarios, async ones too, run clean."""

from __future__ import annotations

import re
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


def test_poked():
    """Private state written by the test: a finished id put back, so delivered twice."""
    h = harness()
    h.add("a", [1, 2, 3, 4, 5, 6, 7, 8], max_tokens=4)
    h.add("b", [1, 2, 3, 4, 5, 6, 7, 8], max_tokens=8)
    while "a" in h.scheduler.requests:
        h.step()
    h.step()  # the step that delivers a's finish
    h.scheduler.finished_req_ids.add("a")
    while h.busy:
        h.step()
    h.step()


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


TEARDOWN = '''
import pytest
from workload import harness, run
from bugs import DropFinishedOnce


@pytest.fixture
def drained():
    """Made in setup, stepped once in the call, run to the end (the leak) in teardown."""
    h = harness(DropFinishedOnce)
    for i in range(2):
        h.add(f"r{i}", [1 + i, 2, 3, 4, 5, 6, 7, 8], max_tokens=4 + i)
    yield h
    while h.busy:
        h.step()


@pytest.fixture
def made_late():
    yield
    run(DropFinishedOnce)


def test_drained_in_teardown(drained):
    drained.step()


def test_made_in_teardown(made_late):
    pass
'''


@pytest.fixture
def suite(pytester, tiny_model):
    pytester.makepyfile(workload=WORKLOAD, bugs=bugged.module_source(["drop_finished_once"]),
                        test_sched=TESTS)
    return pytester


def _run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args, timeout=600)


def _steps(trace):
    (engine,) = open_trace(trace).engines  # a trace that opens: one engine, the scheduler
    return len(engine.read("steps"))


def test_clean_passes_and_a_leak_fails_with_its_finding(suite):
    r = _run(suite, "--vllm-contract", "--junitxml=junit.xml")
    r.assert_outcomes(passed=4, failed=1)
    out = r.stdout.str()
    assert "FAILED test_sched.py::test_leaky" in out
    assert "contract finding(s) in this test's scheduler steps" in out
    assert "finished.leaked" in out
    assert _steps(suite.path / ".vllm-contract" / "test_sched.py" / "test_clean" / "scheduler-0")
    assert "5 test(s) checked, 5 scheduler(s)" in out
    assert "findings: finished.duplicate 1, finished.leaked 1" in out
    # JUnit: the finding as a property of the failing test
    cases = {c.get("name"): c for c in ET.parse(suite.path / "junit.xml").iter("testcase")}
    props = [(p.get("name"), p.get("value")) for p in cases["test_leaky"].iter("property")]
    assert any(n == "vllm_contract_finding" and v.startswith("finished.leaked") for n, v in props)
    # the hand-driven tests: notes, not failures, and counted as such in the summary
    assert "PASSED test_sched.py::test_driven_by_hand" in out
    assert "2 step(s) without update_from_output() (the first at step 0; the last step" in out
    assert "PASSED test_sched.py::test_hand_built_output" in out
    assert ("note: outputs.ids_mismatch at step 0 (ghost) taken for the test's driving (a model "
            "output for ghost, which the step did not schedule)") in out
    assert re.search(r"findings taken for the tests' own driving \(notes\): .*"
                     r"outputs\.ids_mismatch \d", out)
    # poked state is no driving the trace shows: its warning stands, below the default fail-on
    assert "PASSED test_sched.py::test_poked" in out
    assert "reported: warning finished.duplicate at step 5 (a)" in out
    assert "note: finished.duplicate" not in out
    # the shadow worker beside the catalog: the leaked id's state is never freed there; at
    # fail-on warning the poked test's warning fails it; the traces where the option says
    r = _run(suite, "--vllm-contract", "--vllm-contract-worker", "shadow", "-k", "leaky or poked",
             "--vllm-contract-fail-on", "warning", "--vllm-contract-dir", "cli-traces")
    r.assert_outcomes(failed=2, deselected=3)
    out = r.stdout.str()
    assert "worker.never_freed" in out
    assert "FAILED test_sched.py::test_poked" in out
    assert re.search(r"vllm-contract: 1 contract finding\(s\) in this test's scheduler steps\n"
                     r"  finished\.duplicate at step 5 \(a\)", out)
    assert _steps(suite.path / "cli-traces" / "test_sched.py" / "test_poked" / "scheduler-0")


def test_the_baseline_absorbs_a_finding_and_says_when_an_entry_is_not_hit(suite):
    r = _run(suite, "--vllm-contract", "--vllm-contract-baseline", "base.json",
             "--vllm-contract-update-baseline")
    r.assert_outcomes(passed=5)
    assert "baseline written" in r.stdout.str()
    text = (suite.path / "base.json").read_text()
    assert '"test_sched.py::test_leaky"' in text and '"finished.leaked"' in text
    assert '"step"' not in text  # keyed by test and invariant, never by step
    r = _run(suite, "--vllm-contract", "--vllm-contract-baseline", "base.json")
    r.assert_outcomes(passed=5)
    assert "in the baseline: error finished.leaked" in r.stdout.str()
    # an entry for a finding that no longer happens
    data = text.replace('"test_sched.py::test_leaky"', '"test_sched.py::test_clean"')
    (suite.path / "stale.json").write_text(data)
    r = _run(suite, "--vllm-contract", "--vllm-contract-baseline", "stale.json")
    r.assert_outcomes(passed=4, failed=1)
    assert "baseline entry not hit: test_sched.py::test_clean finished.leaked" in r.stdout.str()
    assert r.ret == 1
    r = _run(suite, "--vllm-contract", "--vllm-contract-baseline", "base.json",
             "--vllm-contract-strict", "-k", "clean")
    r.assert_outcomes(passed=1, deselected=4)
    assert r.ret == 1 and "baseline entry not hit" in r.stdout.str()


def test_the_ini_switches_teardown_checks_and_fail_on_never(suite):
    """Turned on and pointed at a folder by the ini file alone; a scheduler driven in teardown
    after the call's check, or made there, fails the teardown; `never` fails nothing and still
    reports."""
    suite.makeini("[pytest]\nvllm_contract = true\nvllm_contract_dir = ini-traces\n")
    suite.makepyfile(test_teardown=TEARDOWN)
    r = _run(suite, "test_teardown.py")
    r.assert_outcomes(passed=2, errors=2)
    out = r.stdout.str()
    for name in ("test_drained_in_teardown", "test_made_in_teardown"):
        assert f"ERROR at teardown of {name}" in out
    assert re.search(r"vllm-contract: 1 contract finding\(s\) in this test's scheduler steps "
                     r"checked after its teardown\n  finished\.leaked", out)
    assert "2 test(s) checked, 3 scheduler(s)" in out
    traces = suite.path / "ini-traces" / "test_teardown.py"
    drained = traces / "test_drained_in_teardown"
    assert _steps(drained / "scheduler-0") == 1  # the call's step, checked clean at its end
    assert _steps(drained / "scheduler-0-teardown") > 1  # the rest, attached mid-stream
    assert _steps(traces / "test_made_in_teardown" / "scheduler-0")
    assert not (suite.path / ".vllm-contract").exists()
    r = _run(suite, "--vllm-contract-fail-on", "never", "test_teardown.py::test_made_in_teardown",
             "test_sched.py::test_leaky")
    r.assert_outcomes(passed=2)
    out = r.stdout.str()
    assert "reported: error finished.leaked" in out and "findings: finished.leaked 2" in out
    assert "failed on findings" not in out


def test_off_changes_nothing_and_bad_setups_are_refused_in_one_line(suite):
    r = _run(suite)
    r.assert_outcomes(passed=5)
    out = r.stdout.str()
    assert "test(s) checked" not in out and "Captured vllm-contract" not in out
    assert not (suite.path / ".vllm-contract").exists()
    for args, line in [
        (["-n", "2"], "--vllm-contract does not run under pytest-xdist (-n)"),
        (["--vllm-contract-baseline", "nope.json"], "does not exist"),
        (["--vllm-contract-update-baseline"], "--vllm-contract-update-baseline needs "
                                              "--vllm-contract-baseline FILE"),
    ]:
        r = _run(suite, "--vllm-contract", *args)
        assert r.ret == pytest.ExitCode.USAGE_ERROR and line in r.stderr.str(), args
    # vLLM missing: one line on what to install, no traceback (the conftest, loaded before
    # the plugin's configure, hides the installed vLLM)
    suite.mkdir("novllm").joinpath("conftest.py").write_text(
        "import sys\n\nsys.modules['vllm'] = None\n")
    r = _run(suite, "--vllm-contract", "novllm")
    err = r.stderr.str()
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "ERROR: --vllm-contract needs vLLM (pip install vllm): cannot import " in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_projects_scenarios_run_clean_under_the_plugin(pytester, tiny_model, monkeypatch):
    """Every scenario of the rig (the real Scheduler on each workload the suite records) under
    the plugin, and two with batches in flight (vLLM's AsyncScheduler, a subclass): no finding
    at all, and none taken for the test's driving: these drive as an engine does (long_run at
    a tenth of its size)."""
    from vllm_contract.rig import scenarios

    monkeypatch.setenv("VLLM_CONTRACT_LONG_REQS", "128")
    monkeypatch.setenv("VLLM_CONTRACT_LONG_STEPS", "1000")
    cases = [(name, 1) for name in sorted(scenarios.SCENARIOS)]
    cases += [("preemption", 2), ("spec_decode", 2)]
    pytester.makepyfile(test_scenarios=f'''
import pytest
from vllm_contract.rig import scenarios, tiny_model

@pytest.mark.parametrize("name,batch_queue", {cases!r})
def test_scenario(name, batch_queue, tmp_path):
    h = scenarios.run(name, str(tiny_model.build()), tmp_path / "own", batch_queue=batch_queue)
    assert type(h.scheduler).__name__ == ("AsyncScheduler" if batch_queue > 1 else "Scheduler")
''')
    r = _run(pytester, "--vllm-contract", "--vllm-contract-fail-on", "warning")
    r.assert_outcomes(passed=len(cases))
    out = r.stdout.str()
    assert re.search(rf"{len(cases)} test\(s\) checked, {len(cases)} scheduler\(s\), "
                     r"[\d,]+ step\(s\); findings: none\n", out)
    assert "findings taken for the tests' own driving (notes): none" in out
    assert "note:" not in out and "error:" not in out
