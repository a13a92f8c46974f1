"""`reduce` on the real vLLM Scheduler (no mocks). Each named break of rig/breaks.py, as a
Scheduler subclass (rig/bugged.py), recorded over 60 requests and more than a thousand steps, is
cut down to at most 3 requests and 10 % of the steps; the reduced trace still has the finding
and none the original lacked; the emitted pytest file, run where vllm_contract cannot be
imported, fails with the subclass and passes with vLLM's Scheduler. The stock Scheduler's re-run
does not show the finding (not the re-run's doing: one line, exit 2); --max-seconds and Ctrl-C
keep the best so far."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.errors import TraceError
from vllm_contract.replay.resim.record import catalog_findings
from vllm_contract.replay.resim.reduce import reduce
from vllm_contract.rig import bugged

import reducekit
import resimkit

MODULE = "reduce_bugs"


@pytest.fixture(scope="module")
def bugs(tmp_path_factory):
    """The subclasses of every named break, importable as reduce_bugs:Class; their folder."""
    root = tmp_path_factory.mktemp("reduce-bugs")
    specs = bugged.write(root, MODULE, list(bugged.SCHEDULER_BREAKS))
    sys.path.insert(0, str(root))
    try:
        yield root, specs
    finally:
        sys.path.remove(str(root))


def _class(spec: str):
    import importlib

    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.fixture(scope="module")
def model_copy(tiny_model, tmp_path_factory):
    """The tiny model in a folder of this module's: a test may take it away for a while."""
    import shutil

    path = tmp_path_factory.mktemp("reduce-model") / "tiny"
    shutil.copytree(tiny_model, path)
    return path


@pytest.fixture(scope="module")
def small(bugs, model_copy, tmp_path_factory):
    """DropFinishedOnce on 12 requests: for the tests of how a reduction runs and stops."""
    root, specs = bugs
    path = tmp_path_factory.mktemp("reduce-small") / "trace"
    bugged.record_workload(_class(specs["drop_finished_once"]), str(model_copy), path,
                           requests=12)
    return path, specs["drop_finished_once"]


@pytest.mark.parametrize("name", bugged.IN_SUITE)
def test_each_named_break_is_reduced_to_a_pytest_file_that_fails_until_fixed(
        name, bugs, tiny_model, tmp_path):
    root, specs = bugs
    invariant = bugged.SCHEDULER_BREAKS[name]
    steps = bugged.record_workload(_class(specs[name]), tiny_model, tmp_path / "rec")
    assert steps >= 1000
    original = catalog_findings(tmp_path / "rec")
    assert invariant in {f.invariant for f in original}
    r = reduce(tmp_path / "rec", invariant, tmp_path / "out", scheduler_cls=specs[name])
    assert r.original_requests == 60 and r.original_steps == steps
    assert 1 <= len(r.best.requests) <= 3 and r.best_steps <= steps // 10
    assert r.stopped is None and r.calls >= 2
    # the reduced trace is a trace: the catalog finds the finding again, and nothing new
    found = catalog_findings(r.trace)
    assert invariant in {f.invariant for f in found}
    assert {f.invariant for f in found} <= {f.invariant for f in original}
    assert not any(f.invariant.startswith("trace.") for f in found)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert invariant in readme and "| recording | 60 |" in readme
    assert f"| reduced | {len(r.best.requests)} |" in readme
    assert not (tmp_path / "out" / ".candidates").exists()
    # the standalone pytest file: fails with the bug, passes without
    assert r.pytest_file == tmp_path / "out" / f"test_{invariant.replace('.', '_')}.py"
    assert "vllm_contract" not in r.pytest_file.read_text() and r.pytest_file.name in readme
    failed = reducekit.run_emitted(r.pytest_file, VLLM_SCHEDULER_CLS=specs[name], PYTHONPATH=str(root))
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert " ".join(reducekit.why(invariant).split()) in " ".join(failed.stdout.split())
    passed = reducekit.run_emitted(r.pytest_file)
    assert passed.returncode == 0, passed.stdout[-3000:]


def test_every_scheduler_break_is_covered_or_documented():
    """Each function of breaks.py is reduced (here, or by `make reduce-all` for rig/bugged.py
    COVERED) or has the reason it is not in docs/reduce.md's table: a break added later cannot
    go unnoticed."""
    import inspect

    from vllm_contract.replay.resim.emit import CONTRACTS
    from vllm_contract.rig import breaks

    names = [n for n, f in vars(breaks).items() if inspect.isfunction(f)
             and f.__module__ == breaks.__name__ and not n.startswith("_")]
    table = (Path(bugged.__file__).parents[1] / "docs" / "reduce.md").read_text()
    for name in names:
        row = next((line for line in table.splitlines() if line.startswith(f"| `{name}` |")),
                   None)
        assert row is not None, f"{name} has no row in docs/reduce.md"
        covered = bugged.COVERED.get(name)
        if covered is not None:
            assert f"`{covered.invariant}`" in row and covered.invariant in CONTRACTS, (name, row)
        else:
            assert "not covered" in row, (name, row)


@pytest.fixture(scope="module")
def serial(small, tmp_path_factory):
    """The small recording reduced one candidate at a time; its output folder."""
    trace, spec = small
    out = tmp_path_factory.mktemp("reduce-serial") / "out"
    return reduce(trace, "finished.leaked", out, scheduler_cls=spec), out


def test_requests_and_settings_are_cut_shorter(serial):
    """The leak needs one request that finishes: its prompt and output are cut shorter and the
    cache made smaller; the report and the file say so."""
    r, out = serial
    (rid,) = r.best.requests
    cut = r.as_dict()["cuts"][rid]
    assert cut["prompt_tokens"] < cut["prompt_tokens_recorded"]
    assert cut["outputs"] < cut["outputs_recorded"]
    settings = r.as_dict()["settings"]
    assert settings["num_kv_blocks"]["value"] < settings["num_kv_blocks"]["recorded"]
    readme = (out / "README.md").read_text()
    assert f"`{rid}` cut shorter: {cut['prompt_tokens']} of its" in readme
    text = r.pytest_file.read_text()
    assert f"NUM_BLOCKS = {settings['num_kv_blocks']['value']}\n" in text
    assert f"'max_tokens': {cut['outputs']}," in text


def test_the_pytest_file_runs_where_the_recorded_model_is_not(bugs, small, serial, model_copy):
    """A vLLM developer pasting the file has no copy of the recording's local model folder:
    the file carries its config.json, so it still fails with the bug and passes without."""
    root, _ = bugs
    _, spec = small
    r, _ = serial
    assert f"MODEL = {str(model_copy)!r}\n" in r.pytest_file.read_text()
    away = model_copy.with_name("away")
    model_copy.rename(away)
    try:
        failed = reducekit.run_emitted(r.pytest_file, VLLM_SCHEDULER_CLS=spec,
                                       PYTHONPATH=str(root), HF_HUB_OFFLINE="1")
        passed = reducekit.run_emitted(r.pytest_file, HF_HUB_OFFLINE="1")
    finally:
        away.rename(model_copy)
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert " ".join(reducekit.why("finished.leaked").split()) in " ".join(failed.stdout.split())
    assert passed.returncode == 0, passed.stdout[-3000:]


def test_jobs_re_run_side_by_side_and_come_to_the_serial_result(small, serial, tmp_path):
    trace, spec = small
    one, _ = serial
    parallel = reduce(trace, "finished.leaked", tmp_path / "two", scheduler_cls=spec, jobs=2)
    assert parallel.best == one.best and parallel.best_steps == one.best_steps
    assert parallel.calls >= one.calls  # a batch's later members run too
    with pytest.raises(TraceError, match="--jobs 0"):
        reduce(trace, "finished.leaked", tmp_path / "zero", jobs=0)


def test_a_finding_the_stock_scheduler_does_not_make_is_refused_in_one_line(small, tmp_path):
    trace, _ = small
    with pytest.raises(TraceError, match="does not survive re-simulation.*--worker shadow"):
        reduce(trace, "finished.leaked", tmp_path / "stock")
    assert not (tmp_path / "stock").exists()
    r = CliRunner().invoke(app, ["reduce", str(trace), "--finding", "finished.leaked", "--out",
                                 str(tmp_path / "stock-cli")])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "does not survive re-simulation" in r.stderr and "Traceback" not in r.output


def test_unusable_input_is_one_line(small, tmp_path):
    trace, _ = small

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


def test_max_seconds_keeps_the_best_so_far(small, tmp_path):
    trace, spec = small
    r = CliRunner().invoke(app, ["reduce", str(trace), "--finding", "finished.leaked",
                                 "--scheduler-cls", spec, "--out", str(tmp_path / "out"),
                                 "--max-seconds", "0", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["stopped"] == "--max-seconds" and out["calls"] == 1
    assert out["requests_after"] == 12  # the whole recording re-run: the only candidate run
    assert "stopped early (--max-seconds)" in r.stderr
    assert any(f.startswith("finished.leaked") for f in out["findings"])


def test_ctrl_c_keeps_the_best_so_far(bugs, small, tmp_path):
    """SIGINT to a running `vllm-contract reduce` once it reports progress: it ends at once
    with the best reduction so far written out, as a finished one is."""
    root, _ = bugs
    trace, spec = small
    cli = Path(sys.executable).with_name("vllm-contract")
    proc = subprocess.Popen([str(cli), "reduce", str(trace), "--finding", "finished.leaked",
                             "--scheduler-cls", spec, "--out", str(tmp_path / "out"), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)})
    try:
        for line in proc.stderr:  # the first progress line: a reduction is under way
            if line.startswith("reducing finished.leaked"):
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    out = json.loads(stdout)
    assert out["stopped"] == "interrupted" and out["requests_after"] <= 12
    assert "stopped early (interrupted)" in stderr and "Traceback" not in stderr
    assert any(f.startswith("finished.leaked") for f in out["findings"])
    assert (tmp_path / "out" / "trace").is_dir() and (tmp_path / "out" / "README.md").exists()
    assert not (tmp_path / "out" / ".candidates").exists()
