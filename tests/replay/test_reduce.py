"""`reduce` on the real vLLM Scheduler (no mocks): a recording of DropFinishedOnce (a Scheduler
subclass that loses one finished id) over 60 requests and more than a thousand steps is cut
down to at most 3 requests and 10 % of the steps, the reduced trace still has the finding and
none the original lacked, and the emitted pytest file (vLLM and pytest only) fails with the
subclass and passes with vLLM's Scheduler; the stock Scheduler's re-run does not show the
finding (not the re-run's doing: one line, exit 2); --max-seconds keeps the best so far."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.errors import TraceError
from vllm_contract.replay.resim.record import catalog_findings
from vllm_contract.replay.resim.reduce import reduce

import resimkit

BUG = "reduce_bug_sched:DropFinishedOnce"


@pytest.fixture(scope="module")
def recording(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("reduce")
    with resimkit.bug_scheduler(root, "reduce_bug_sched") as bug:
        steps = resimkit.record_workload(bug, tiny_model, root / "bug")
        yield root / "bug", steps


def test_a_request_never_sent_as_new_is_reduced_to_a_failing_pytest_file(tiny_model, tmp_path):
    import importlib

    with resimkit.bug_scheduler(tmp_path, "reduce_forget_sched"):
        forget = importlib.import_module("reduce_forget_sched").ForgetNewRequest
        steps = resimkit.record_workload(forget, tiny_model, tmp_path / "forget")
        r = reduce(tmp_path / "forget", "lifecycle.unknown_cached", tmp_path / "out",
                   scheduler_cls="reduce_forget_sched:ForgetNewRequest")
    assert 1 <= len(r.best.requests) <= 3 and r.best_steps <= steps // 10
    assert "lifecycle.unknown_cached" in {f.invariant for f in catalog_findings(r.trace)}
    failed = _pytest(r.pytest_file, VLLM_SCHEDULER_CLS="reduce_forget_sched:ForgetNewRequest",
                     PYTHONPATH=str(tmp_path))
    assert failed.returncode == 1 and "never sent in scheduled_new_reqs" in failed.stdout
    assert "KeyError deep in the model runner" in failed.stdout  # the why
    assert _pytest(r.pytest_file).returncode == 0


def test_a_leaked_finish_is_reduced_to_a_few_requests_and_steps(recording, tmp_path):
    trace, steps = recording
    assert steps >= 1000
    original = catalog_findings(trace)
    assert "finished.leaked" in {f.invariant for f in original}
    r = reduce(trace, "finished.leaked", tmp_path / "out", scheduler_cls=BUG)
    assert r.original_requests == 60 and r.original_steps == steps
    assert 1 <= len(r.best.requests) <= 3
    assert r.best_steps <= steps // 10
    assert r.stopped is None and r.calls >= 2
    # the reduced trace is a trace: the catalog finds the leak again, and nothing new
    found = catalog_findings(r.trace)
    assert "finished.leaked" in {f.invariant for f in found}
    assert {f.invariant for f in found} <= {f.invariant for f in original}
    assert not any(f.invariant.startswith("trace.") for f in found)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "finished.leaked" in readme and "| recording | 60 |" in readme
    assert f"| reduced | {len(r.best.requests)} |" in readme
    assert not (tmp_path / "out" / ".candidates").exists()
    # the standalone pytest file: vLLM and pytest only; fails with the bug, passes without
    assert r.pytest_file == tmp_path / "out" / "test_finished_leaked.py"
    text = r.pytest_file.read_text()
    assert "vllm_contract" not in text and r.pytest_file.name in readme
    bug_dir = str(trace.parent)
    failed = _pytest(r.pytest_file, VLLM_SCHEDULER_CLS=BUG, PYTHONPATH=bug_dir)
    assert failed.returncode == 1, failed.stdout[-2000:]
    assert "is not in its finished_req_ids" in failed.stdout
    assert "leaks that state" in failed.stdout  # the invariant's why, as the message
    passed = _pytest(r.pytest_file)
    assert passed.returncode == 0, passed.stdout[-2000:]


def test_jobs_re_run_side_by_side_and_come_to_the_serial_result(recording, tmp_path):
    trace, _ = recording
    serial = reduce(trace, "finished.leaked", tmp_path / "one", scheduler_cls=BUG)
    parallel = reduce(trace, "finished.leaked", tmp_path / "two", scheduler_cls=BUG, jobs=2)
    assert parallel.best == serial.best and parallel.best_steps == serial.best_steps
    assert parallel.calls >= serial.calls  # a batch's later members run too
    with pytest.raises(TraceError, match="--jobs 0"):
        reduce(trace, "finished.leaked", tmp_path / "zero", jobs=0)


def _pytest(path, **env):
    """The emitted file run by pytest in a fresh process, from its own directory (no conftest
    of this project in reach)."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(path.parent), path.name], cwd=path.parent,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def test_a_finding_the_stock_scheduler_does_not_make_is_refused_in_one_line(recording,
                                                                             tmp_path):
    trace, _ = recording
    with pytest.raises(TraceError, match="does not survive re-simulation.*--worker shadow"):
        reduce(trace, "finished.leaked", tmp_path / "stock")
    assert not (tmp_path / "stock").exists()
    r = CliRunner().invoke(app, ["reduce", str(trace), "--finding", "finished.leaked", "--out",
                                 str(tmp_path / "stock-cli")])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "does not survive re-simulation" in r.stderr and "Traceback" not in r.output


def test_unusable_input_is_one_line(recording, tmp_path):
    trace, _ = recording

    def run(*args):
        return CliRunner().invoke(app, ["reduce", *map(str, args)])

    r = run(trace, "--finding", "blocks.no_such_check", "--out", tmp_path / "a")
    assert r.exit_code == 2 and "has no blocks.no_such_check finding" in r.stderr
    assert "finished.leaked" in r.stderr  # what it has instead
    r = run(resimkit.without_input_log(trace, tmp_path / "v2"), "--finding", "finished.leaked",
            "--out", tmp_path / "b")
    assert r.exit_code == 2 and "input log" in r.stderr
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    r = run(trace, "--finding", "finished.leaked", "--out", tmp_path / "used")
    assert r.exit_code == 2 and "already exists" in r.stderr


def test_max_seconds_keeps_the_best_so_far(recording, tmp_path):
    trace, steps = recording
    r = CliRunner().invoke(app, ["reduce", str(trace), "--finding", "finished.leaked",
                                 "--scheduler-cls", BUG, "--out", str(tmp_path / "out"),
                                 "--max-seconds", "0", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["stopped"] == "--max-seconds" and out["calls"] == 1
    assert out["requests_after"] == 60  # the whole recording re-run: the only candidate run
    assert "stopped early (--max-seconds)" in r.stderr
    assert any(f.startswith("finished.leaked") for f in out["findings"])
