"""A trace still being recorded is read as such: one line says so, what is flushed is checked,
and nothing calls the writer dead; a trace whose recorder died is named as dead. Real
Scheduler (harness), recorded in this process with both writers."""

from __future__ import annotations

import json

import pytest

from readerkit import invoke
from vllm_contract import liveness
from vllm_contract.recorder import attach
from vllm_contract.rig import scenarios
from vllm_contract.rig.harness import Harness
from vllm_contract.trace import open_trace


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_trace_being_recorded_is_checked_as_live(tiny_model, tmp_path, writer):
    s = scenarios.SCENARIOS["mixed"]
    h = Harness(tiny_model, s.config)
    rec = attach(h.scheduler, tmp_path / "t", writer=writer)
    try:
        s.drive(h)
        assert rec.flush()
        (e,) = open_trace(tmp_path / "t").engines
        assert e.manifest["closed_cleanly"] is False and e.recording is True
        flushed = e.read("steps").num_rows
        assert flushed > 0
        r = invoke("check", tmp_path / "t", "-f", "json")
        assert r.exit_code == 0, r.output
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and "is still being recorded" in lines[0], r.stderr
        assert "died" not in r.stderr
        assert "trace.unclean_close" not in {f["invariant"] for f in json.loads(r.stdout)}
        r = invoke("sql", tmp_path / "t", "SELECT COUNT(*) AS n FROM steps", "-f", "json")
        assert json.loads(r.stdout) == [{"n": flushed}]
        r = invoke("info", tmp_path / "t")
        assert "still being recorded" in r.stdout and "died" not in r.stdout
    finally:
        assert rec.close()
    # closed: no lock left behind, and nothing said about a live recording
    (e,) = open_trace(tmp_path / "t").engines
    assert e.manifest["closed_cleanly"] is True and e.recording is None
    assert not list((tmp_path / "t").rglob(liveness.NAME))
    r = invoke("check", tmp_path / "t")
    assert r.exit_code == 0 and "still being recorded" not in r.stderr


def test_a_lock_nobody_holds_is_a_dead_recorder(tiny_model, tmp_path):
    """What a SIGKILLed recorder leaves: the manifest not closed and the lock file unheld
    (tests/recorder/test_crash_safety.py kills a real one)."""
    scenarios.run("chunked_prefill", tiny_model, tmp_path / "t")
    (e,) = open_trace(tmp_path / "t").engines
    m = dict(e.manifest, closed_cleanly=False)
    (e.dir / "manifest.json").write_text(json.dumps(m))
    (e.dir / liveness.NAME).write_bytes(b"")
    (e,) = open_trace(tmp_path / "t").engines
    assert e.recording is False
    r = invoke("check", tmp_path / "t", "-f", "json")
    assert "trace.unclean_close" in {f["invariant"] for f in json.loads(r.stdout)}
    assert "still being recorded" not in r.stderr
    r = invoke("info", tmp_path / "t")
    assert "died" in r.stdout
