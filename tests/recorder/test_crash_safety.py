"""SIGKILL a process recording a long harness run at a random moment: the trace still opens and
every step that was flushed before the kill is in it. With the writer thread, "flushed" means
written by the killed process; with the writer process, every step the engine had handed over
(its update returned) is written by the writer process after the engine's death."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vllm_contract.replay.query.summary import summary
from vllm_contract.trace import open_trace

CHILD = textwrap.dedent("""
    import os, sys
    from vllm_contract.recorder import segments
    from vllm_contract.rig import scenarios

    witness = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    original = segments.SegmentSet.write

    def write(self, batches):
        original(self, batches)  # returns once the data is in the kernel
        steps = batches["steps"].column("step")
        if len(steps):
            os.write(witness, f"{steps[-1].as_py()}\\n".encode())

    segments.SegmentSet.write = write
    scenarios.run("long_run", sys.argv[1], sys.argv[2], flush_steps=64, writer="thread")
""")

# The writer process writes the segments; the engine's witness is each step whose update
# returned (its items are then committed to the ring).
CHILD_PROCESS_WRITER = textwrap.dedent("""
    import os, sys
    from vllm_contract.recorder.attach import Recorder
    from vllm_contract.rig import scenarios

    witness = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    original = Recorder._update_from_output

    def update(self, so, *a, **k):
        entry = self._inflight.get(id(so))
        out = original(self, so, *a, **k)
        if entry is not None and entry[0] % 16 == 0:
            os.write(witness, f"{entry[0]}\\n".encode())
        return out

    Recorder._update_from_output = update
    scenarios.run("long_run", sys.argv[1], sys.argv[2], flush_steps=64, writer="process")
""")


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_sigkill_keeps_every_flushed_step(tiny_model, tmp_path, writer):
    trace, witness = tmp_path / "trace", tmp_path / "flushed.txt"
    code = CHILD if writer == "thread" else CHILD_PROCESS_WRITER
    env = dict(os.environ, VLLM_CONTRACT_LONG_REQS="256", VLLM_CONTRACT_LONG_STEPS="1000000")
    seed = random.randrange(1 << 30)
    delay = random.Random(seed).uniform(1.0, 4.0)
    proc = subprocess.Popen([sys.executable, "-c", code, tiny_model, str(trace), str(witness)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not (witness.exists() and witness.stat().st_size) and time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        assert witness.exists(), "the child never flushed a batch"
        time.sleep(delay)
        assert proc.poll() is None, "the run ended before the kill"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    flushed = max(int(x) for x in witness.read_text().split())
    if writer == "process":  # it outlives the engine and seals the trace on its own
        deadline = time.time() + 120
        while time.time() < deadline:
            (manifest,) = trace.glob("_engines/*/manifest.json")
            if json.loads(manifest.read_text()).get("ended_at"):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the writer process did not seal the trace")

    t = open_trace(trace)
    steps = t.read("steps")["step"].to_pylist()
    assert steps == list(range(len(steps))), f"seed {seed}: steps not contiguous"
    assert len(steps) - 1 >= flushed, f"seed {seed}: flushed up to {flushed}, read {len(steps)}"
    # Other tables stop at the same point, give or take the batch being written at the kill.
    assert max(t.read("scheduled")["step"].to_pylist()) >= flushed
    s = summary(t)["engines"][0]
    assert s["closed_cleanly"] is False
    if writer == "process":
        assert "ended without closing" in t.engines[0].manifest["ended_by"]
    assert any("not closed cleanly" in i for i in s["integrity"])
    if writer == "thread":  # the writer died with the process, its lock with it
        assert t.engines[0].recording is False
        assert any("died" in i for i in s["integrity"]), s["integrity"]
