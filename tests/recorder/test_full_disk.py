"""A full disk stops the recording cleanly, and says so: on a real small filesystem (a tmpfs
the test mounts), at several fill points, for both writers. The engine's outputs do not
change; readers see whole flushes only, so the torn one makes no false contract finding; the
manifest says where and why the recording stopped, and `check` reports that once."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.rig import scenarios
from vllm_contract.trace import open_trace

SCENARIO = "mixed"


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of the size asked for; unmounted afterwards."""
    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, text=True)
        assert r.returncode == 0, (
            f"this test mounts a small tmpfs and needs root (CI and `make test` run as root "
            f"here): {r.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], capture_output=True)


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The scenario's outputs with no recorder at all."""
    return scenarios.run(SCENARIO, tiny_model).outputs


def _problems(trace) -> list[tuple]:
    with Gateway(trace) as gw:
        report = checker.run(gw, catalog.load())
    return [(f.invariant, f.severity, f.step, f.message) for f in report.findings
            if f.severity != "info"]


@pytest.mark.parametrize("writer", ["thread", "process"])
@pytest.mark.parametrize("size", ["112k", "160k", "224k"])
def test_full_disk_mid_run(size, writer, tiny_model, small_disk, reference):
    disk = small_disk(size)
    h = scenarios.run(SCENARIO, tiny_model, disk / "t", writer=writer, flush_steps=4)
    assert h.outputs == reference  # the engine never pays
    (e,) = open_trace(disk / "t").engines
    stopped = e.manifest.get("stopped")
    assert stopped and "No space left on device" in stopped["error"], e.manifest
    assert not e.manifest["closed_cleanly"]
    steps = e.read("steps").column("step").to_pylist()
    assert steps == list(range(len(steps)))  # whole flushes, nothing torn
    assert stopped["after_step"] == (steps[-1] if steps else None)
    assert e.manifest["steps_recorded"] == len(steps)
    # no table shows a row of the flush the full disk tore (readers cut it at the last whole
    # one), not even of a step it had finished writing elsewhere
    for table in ("scheduled", "requests", "updates", "model_outputs", "finished"):
        rows = e.read(table).column("step").to_pylist()
        assert not rows or max(rows) <= (steps[-1] if steps else -1), table
    # each step's rows are whole: the scheduled rows sum to the step's total
    sched = e.read("scheduled").to_pylist()
    for row in e.read("steps").to_pylist():
        assert row["total_num_scheduled_tokens"] == sum(
            r["num_scheduled_tokens"] or 0 for r in sched if r["step"] == row["step"])
    assert not list(e.dir.glob(".manifest.json.tmp-*"))
    problems = _problems(disk / "t")
    assert [p[0] for p in problems] == ["trace.recorder_stopped"], problems
    assert "No space left on device" in problems[0][3]
    r = CliRunner().invoke(app, ["info", str(disk / "t"), "-f", "json"])
    assert r.exit_code == 0, r.output
    assert any("recording stopped" in line
               for line in json.loads(r.stdout)["engines"][0]["integrity"])


def test_disk_full_before_any_data(tiny_model, small_disk, reference):
    # room for the manifest, none for the reserve that guarantees its last rewrite
    disk = small_disk("24k")
    h = scenarios.run(SCENARIO, tiny_model, disk / "t", writer="thread")
    assert h.outputs == reference
    (e,) = open_trace(disk / "t").engines
    assert "No space left on device" in e.manifest["stopped"]["error"]
    assert e.manifest["stopped"]["after_step"] is None
    assert e.read("steps").num_rows == 0
    assert not list(e.dir.glob(".manifest.json.tmp-*"))
    problems = _problems(disk / "t")
    assert [p[0] for p in problems] == ["trace.recorder_stopped"], problems
