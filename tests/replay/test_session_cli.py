"""The replay Session (step, back, goto, state, cancel) and the CLI over it: `replay` and
`check --worker shadow`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.errors import TraceError
from vllm_contract.replay import Session

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
runner = CliRunner()


def test_goto_equals_stepping_and_back_undoes():
    s = Session(SAMPLES / "mixed", checkpoint_every=16)
    states = [s.state()]
    for _ in range(60):
        s.step()
        states.append(s.state())
    assert states[0] != states[40] and states[40]["batch"]
    for k in (40, 3, 59, 17, 0, 33):
        s.goto(k)
        assert s.position == k and s.state() == states[k]
    s.goto(34)
    s.back()
    assert s.state() == states[33]
    json.dumps(states[40])


def test_findings_follow_the_position():
    s = Session(SAMPLES / "broken-unknown-cached")
    assert s.findings == [] and s.divergences == []
    found = s.step()
    assert found.applied and found.divergences == []
    assert [(f.invariant, f.step) for f in found.findings] == [("worker.unknown_scheduled", 0)]
    s.run()
    assert [f.invariant for f in s.findings] == ["worker.unknown_scheduled",
                                                 "worker.unknown_cached"]
    s.goto(0)
    assert s.findings == []


def test_progress_and_cancel():
    s = Session(SAMPLES / "mixed", checkpoint_every=8)
    seen = []
    assert s.run(progress=lambda n, total: seen.append((n, total)))
    assert seen[-1] == (len(s.steps), len(s.steps))
    s.goto(0)
    stop = threading.Event()
    stop.set()
    assert s.goto(len(s.steps), cancel=stop) is False
    assert s.position < len(s.steps)
    assert s.goto(len(s.steps), cancel=lambda: False)


def test_unknown_workers_and_engines_are_trace_errors():
    with pytest.raises(TraceError, match="unknown worker 'gpu'"):
        Session(SAMPLES / "mixed", worker="gpu")
    with pytest.raises(TraceError, match="no engine"):
        Session(SAMPLES / "mixed", engine="engine=nope")


def test_replay_json_clean_and_broken():
    r = runner.invoke(app, ["replay", str(SAMPLES / "mixed"), "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["steps_replayed"] > 100 and out["first"] is None and out["findings"] == []
    r = runner.invoke(app, ["replay", str(SAMPLES / "broken-leak"), "-f", "json"])
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert (out["first"]["invariant"], out["first"]["step"], out["first"]["req_id"]) == (
        "worker.never_freed", 31, "p0")


def test_replay_stop_at_first_from_until_and_jsonl():
    path = str(SAMPLES / "broken-unknown-cached")
    r = runner.invoke(app, ["replay", path, "--stop-at-first", "-f", "json"])
    out = json.loads(r.stdout)
    assert r.exit_code == 1 and out["steps_replayed"] == 1
    assert [f["step"] for f in out["findings"]] == [0]
    r = runner.invoke(app, ["replay", path, "--from", "1", "-f", "jsonl"])
    assert r.exit_code == 1
    assert [json.loads(x)["invariant"] for x in r.stdout.splitlines()] == [
        "worker.unknown_cached"]
    r = runner.invoke(app, ["replay", path, "--until", "0"])
    assert r.exit_code == 1 and "1 step(s) replayed" in r.stdout
    assert "worker.unknown_scheduled" in r.stdout and "unknown_cached" not in r.stdout


def test_replay_exit_2_on_unusable_input(tmp_path):
    r = runner.invoke(app, ["replay", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no such trace" in r.stderr
    r = runner.invoke(app, ["replay", str(SAMPLES / "mixed"), "--worker", "vllm", "--model",
                            str(tmp_path / "no-model")])
    assert r.exit_code == 2 and "does not exist here" in r.stderr
    r = runner.invoke(app, ["replay", str(SAMPLES / "mixed"), "--worker", "gpu"])
    assert r.exit_code == 2


def _refusal(command: str, model: Path) -> str:
    """The one line a real worker's command gives for `--model MODEL`, in a process of its own
    (the TUI's app would start if the command did not refuse)."""
    r = subprocess.run([sys.executable, "-c", "import sys\nfrom vllm_contract.cli import main\n"
                        "sys.argv[0] = 'vllm-contract'\nmain()", command, str(SAMPLES / "mixed"),
                        "--worker", "vllm", "--model", str(model)],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    [line] = r.stderr.splitlines()
    assert line.startswith("vllm-contract: error: ") and str(model) in line
    return line


@pytest.mark.parametrize("command", ["replay", "tui"])
def test_a_directory_that_is_no_model_is_named_before_an_engine_is_built(tmp_path, command):
    """vLLM itself finds out only while it builds the engine, and says neither what nor where."""
    model = tmp_path / "not-a-model"
    model.mkdir()
    (model / "notes.txt").write_text("the weights are elsewhere")
    assert "is not a model directory: it has no config.json" in _refusal(command, model)
    (model / "config.json").write_text("{}")
    line = _refusal(command, model)
    assert "it has no weights (*.safetensors, *.bin, *.pt files" in line


def test_a_model_directory_with_config_and_weights_passes(tmp_path):
    from vllm_contract.replay.worker.plan import model_path
    from vllm_contract.trace import open_trace

    engine = open_trace(SAMPLES / "mixed").engines[0]
    for weights in ("model.safetensors", "pytorch_model-00001-of-00002.bin"):
        model = tmp_path / weights
        model.mkdir()
        (model / "config.json").write_text("{}")
        (model / weights).write_bytes(b"")
        assert model_path(engine, str(model)) == str(model)
    with pytest.raises(TraceError, match="does not exist here"):
        model_path(engine, str(tmp_path / "gone"))


def test_check_worker_shadow_dedupes_what_the_catalog_says(tmp_path):
    path = str(SAMPLES / "broken-unknown-cached")
    plain = json.loads(runner.invoke(app, ["check", path, "-f", "json"]).stdout)
    r = runner.invoke(app, ["check", path, "-f", "json", "--worker", "shadow"])
    both = json.loads(r.stdout)
    assert r.exit_code == 1
    # the worker's two findings say what tokens.unlisted_request and
    # lifecycle.unknown_cached say at the same step and request: both left out
    assert both == plain
    # on the catalog's own, without that check, the worker's finding stays
    r = runner.invoke(app, ["check", path, "-f", "json", "--worker", "shadow",
                            "--only", "lifecycle.unknown_cached"])
    got = [(f["invariant"], f["step"], f["req_id"]) for f in json.loads(r.stdout)]
    assert ("worker.unknown_scheduled", 0, "a3") in got
    assert ("worker.unknown_cached", 1, "a3") not in got
    r = runner.invoke(app, ["check", path, "--worker", "shadow", "--only",
                            "lifecycle.unknown_cached"])
    assert "ERROR   worker.unknown_scheduled  (1)" in r.stdout


def test_check_worker_shadow_is_silent_on_clean_samples(tmp_path):
    for sample in ("mixed", "mixed-async", "encoder-lookalike"):
        r = runner.invoke(app, ["check", str(SAMPLES / sample), "-f", "json",
                                "--worker", "shadow"])
        assert r.exit_code == 0
        assert not [f for f in json.loads(r.stdout) if f["invariant"].startswith("worker.")]
    shutil.copytree(SAMPLES / "mixed", tmp_path / "t")
    r = runner.invoke(app, ["check", str(tmp_path / "t"), "--worker", "shadow"])
    assert r.exit_code == 0
