"""What an armed engine says in vLLM's log: armed (and how to record it), a recording's start and
stop through `vllm-contract attach`/`detach`, its shutdown; and nothing of vLLM's "Unknown vLLM
environment variable" warning for our settings. A real `LLM` (tiny model, CPU) in a process of its
own, nothing mocked."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from vllm_contract.trace import open_trace

import live_child

CLI = [str(Path(sys.executable).with_name("vllm-contract"))]


@pytest.fixture
def run_dir():
    d = Path(tempfile.mkdtemp(prefix="vc-run-", dir="/tmp"))  # short: socket paths are limited
    yield d / "run"
    shutil.rmtree(d, ignore_errors=True)


def test_armed_engine_logs_armed_recording_stopped_and_shut_down(tiny_model, tmp_path, run_dir):
    res, trace, log = tmp_path / "results", tmp_path / "trace", tmp_path / "child.log"
    res.mkdir()
    env = live_child.child_env(False, VLLM_CONTRACT_ARM="1", VLLM_CONTRACT_RUN_DIR=run_dir,
                               VLLM_LOGGING_LEVEL="INFO")
    child = subprocess.Popen([sys.executable, live_child.PATH, tiny_model, str(res), "serve"],
                             env=env, stdin=subprocess.PIPE, stdout=log.open("wb"),
                             stderr=subprocess.STDOUT, start_new_session=True)
    cenv = live_child.child_env(False, VLLM_CONTRACT_RUN_DIR=run_dir)

    def cli(*args: str) -> subprocess.CompletedProcess:
        r = subprocess.run(CLI + list(args), env=cenv, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        return r

    def phase(name: str) -> None:
        child.stdin.write(f"{name} 2\n".encode())
        child.stdin.flush()
        while not (res / f"{name}.json").exists():
            assert child.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)

    try:
        while not (res / "ready").exists():
            assert child.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        pid = child.pid
        cli("attach", str(pid), "--out", str(trace))
        phase("a")
        cli("detach", str(pid))
        child.stdin.write(b"exit\n")
        child.stdin.close()
        assert child.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    out = log.read_text(errors="replace")
    (engine,) = open_trace(trace).engines
    steps = json.loads((engine.dir / "manifest.json").read_text())["steps_recorded"]
    assert steps > 0
    lines = [ln.split("vllm-contract: ", 1)[1] for ln in out.splitlines()
             if "vllm-contract: " in ln]
    assert lines == [
        f"engine armed, not recording (pid {pid}, dp rank 0; VLLM_CONTRACT_ARM=1): "
        f"`vllm-contract attach {pid} --out DIR` records it",
        f"recording engine {engine.name} (pid {pid}) into {trace} (vllm-contract attach)",
        f"stopped recording engine {engine.name} into {trace} after {steps} steps (detach)",
        f"engine shut down (pid {pid}, dp rank 0): no longer armed",
    ], out
    # ours only: vLLM may name other variables of the environment (VLLM_DIST_IDENT, ...)
    assert "Unknown vLLM environment variable detected: VLLM_CONTRACT" not in out, out
