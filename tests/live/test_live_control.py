"""The plugin's machinery on the real Scheduler (harness, no model), in this process: what an
unarmed plugin does (nothing), the armed gate and its step boundaries, limits, failures at start,
the control socket with `ps`/`attach`/`detach`, and the refusal of another uid."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vllm_contract import schema
from vllm_contract.cli import app
from vllm_contract.recorder import plugin, settings
from vllm_contract.recorder.armed import RecordingError
from vllm_contract.recorder.control import ControlServer
from vllm_contract.replay.worker import canonical
from vllm_contract.trace import open_trace
from vllm_contract.rig.harness import Harness, HarnessConfig
from vllm_contract.rig.scenarios import prompt

ERR = "vllm-contract: error: "


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(r) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERR), r.stderr
    assert "Traceback" not in r.output
    return lines[0][len(ERR):]


class Load:
    """The real Scheduler with requests coming and going, and every SchedulerOutput kept in
    canonical form (taken before the recorder sees it)."""

    def __init__(self, model: str) -> None:
        self.h = Harness(model, HarnessConfig(max_num_batched_tokens=64, num_blocks=64))
        self.live: list = []
        self.n = 0
        original = self.h.scheduler.schedule

        def schedule(*a, **kw):
            out = original(*a, **kw)
            self.live.append(canonical.from_live(out))
            return out

        self.h.scheduler.schedule = schedule  # under the gate: it sees every step

    def add(self, k: int = 2, tokens: int = 12) -> None:
        for _ in range(k):
            self.h.add(f"r{self.n}", prompt(self.n, 40), max_tokens=tokens)
            self.n += 1

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.h.step()

    def drain(self) -> None:
        self.h.run()


def wait_sealed(trace_dir: Path, timeout: float = 30) -> None:
    """A recording that ends at a step boundary is sealed by its writer thread, a moment later."""
    end = time.time() + timeout
    while True:
        manifests = list(trace_dir.glob(f"{schema.ENGINES_DIR}/engine=*/manifest.json"))
        if manifests and all(json.loads(m.read_text())["ended_at"] for m in manifests):
            return
        assert time.time() < end, f"{trace_dir} not sealed"
        time.sleep(0.05)


def assert_trace_is(trace_dir: Path, live: list) -> dict:
    wait_sealed(trace_dir)
    (engine,) = open_trace(trace_dir).engines
    recorded = list(canonical.from_trace(engine))
    assert [s for s, _ in recorded] == list(range(len(live)))
    for (step, got), want in zip(recorded, live):
        assert got == want, f"step {step} differs"
    # Every recorded step ends whole: its update is in the trace too.
    assert sorted(engine.read("updates")["step"].to_pylist()) == list(range(len(live)))
    assert engine.manifest["closed_cleanly"] is True
    return engine.manifest


@pytest.fixture
def load(tiny_model):
    return Load(tiny_model)


@pytest.fixture
def armed(load):
    a = plugin.arm_engine(None, load.h.scheduler, settings.Settings(arm=True), serve=False)
    yield a
    a.disarm()


def test_unarmed_plugin_changes_nothing(monkeypatch):
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    for name in (settings.TRACE_DIR, settings.ARM):
        monkeypatch.delenv(name, raising=False)
    before = (dict(EngineCore.__dict__), WorkerWrapperBase.execute_model)
    plugin.register()
    assert plugin._settings is None
    assert (dict(EngineCore.__dict__), WorkerWrapperBase.execute_model) == before
    assert "scheduler" not in EngineCore.__dict__
    monkeypatch.setenv(settings.ARM, "0")
    assert not settings.wants_plugin()


def test_armed_gate_is_one_flag_and_recording_starts_at_a_step_boundary(load, armed, tmp_path):
    sched = load.h.scheduler
    assert sched.schedule._vllm_contract_gate is armed and armed.pending is False
    load.add(3)
    load.steps(4)  # not recorded
    rec = armed.start(str(tmp_path), started_by="test", max_steps=6)
    assert armed.describe()["state"] == "starting" and armed.recorder is None
    first = len(load.live)
    load.steps(10)  # the limit ends it after 6 whole steps, at the 7th boundary
    assert armed.recorder is None and armed.pending is False
    assert armed.history[-1]["reason"] == "step limit" and armed.history[-1]["steps"] == 6
    assert rec.writer.wait_closed(10)
    m = assert_trace_is(tmp_path, load.live[first:first + 6])
    assert m["started_by"] == "test" and m["limits"] == {"steps": 6, "seconds": None}
    assert m["attached_mid_stream"] is True and m["worker_state_at_start"]["requests"] == 3
    assert m["worker_replayable"] is False
    assert sched.__dict__.keys() & {"update_from_output", "finish_requests"} == set()


def test_stop_from_another_thread_ends_after_a_whole_step(load, armed, tmp_path):
    load.add(4, tokens=200)
    load.steps(2)
    armed.start(str(tmp_path), started_by="test")
    load.steps(1)
    first = len(load.live) - 1
    result = {}
    t = threading.Thread(target=lambda: result.update(armed.stop("detach")))
    t.start()
    while t.is_alive():
        load.steps(1)
    assert result["closed"] and result["closed_cleanly"], result
    recorded = result["steps"]
    assert recorded >= 1
    assert_trace_is(tmp_path, load.live[first:first + recorded])
    assert armed.history[-1]["reason"] == "detach"


def test_idle_engine_starts_and_stops_without_a_step(load, armed, tmp_path):
    load.add(2)
    load.drain()
    assert not load.h.scheduler.has_requests()
    armed.start(str(tmp_path / "a"), started_by="test")
    result = armed.stop()  # idle: closed from here, at once
    assert result["steps"] == 0 and result["closed_cleanly"]
    # An idle engine whose next requests come later: recording covers exactly those.
    armed.start(str(tmp_path / "b"), started_by="test")
    first = len(load.live)
    load.add(2)
    load.drain()
    result = armed.stop()
    m = assert_trace_is(tmp_path / "b", load.live[first:])
    assert result["steps"] == len(load.live) - first > 0
    assert m["attached_mid_stream"] is False and m["worker_replayable"] is True


def test_start_failures_leave_the_engine_alone(load, armed, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        armed.start(str(blocker / "trace"), started_by="test")
    armed.start(str(tmp_path / "t"), started_by="test")
    with pytest.raises(RecordingError, match="already recording"):
        armed.start(str(tmp_path / "u"), started_by="test")
    armed.stop()
    with pytest.raises(RecordingError, match="not recording"):
        armed.stop()
    load.add(2)
    load.drain()  # steps fine, unrecorded
    assert armed.recorder is None and len(load.live) > 3


def test_recorder_error_closes_the_recording_and_the_engine_goes_on(load, armed, tmp_path):
    """Disk full mid-recording: the next segment's files are /dev/full."""
    rec = armed.start(str(tmp_path), started_by="test", flush_steps=1, segment_bytes=1)
    load.add(3, tokens=30)
    load.steps(3)
    assert rec.flush(10)  # the tables' directories exist (a writer process starts on its own)
    for table in ("steps", "scheduled"):
        for k in range(1, 200):
            p = schema.table_dir(rec.path, table) / f"{k:06d}.arrows"
            if not p.exists():
                p.symlink_to("/dev/full")
    load.drain()
    # The writer fails on its own thread; the engine lets go of it at its next step, which
    # may come after the last request finished.
    deadline = time.time() + 10
    while armed.recorder is not None and time.time() < deadline:
        time.sleep(0.02)
        load.steps(1)
    assert armed.recorder is None
    assert armed.history[-1]["_recorder"].writer.wait_closed(10)
    last = armed.ended(armed.history[-1])
    assert last["sealed"] and last["closed_cleanly"] is False
    assert last["failed"] and last["reason"] == "recorder error"
    assert any("No space left" in e for e in last["errors"]), last
    m = json.loads((rec.path / "manifest.json").read_text())
    assert m["closed_cleanly"] is False and m["recorder_errors"]
    # The scheduler is back to the gate alone, and finished every request.
    assert load.h.scheduler.__dict__.keys() & {"update_from_output", "finish_requests"} == set()
    assert all(len(v) == 30 for v in load.h.outputs.values())


# -- control socket ---------------------------------------------------------------------------
@pytest.fixture
def server(armed, monkeypatch):
    """A control socket for the harness engine, in a run dir that `nobody` could traverse to
    if its permissions allowed (pytest's own tmp dir is closed to other users)."""
    base = Path(tempfile.mkdtemp(prefix="vllm-contract-test-", dir="/tmp"))
    os.chmod(base, 0o711)
    monkeypatch.setenv(settings.RUN_DIR, str(base / "run"))
    srv = ControlServer(lambda: [armed])
    yield srv
    srv.close()
    shutil.rmtree(base)


def test_ps_attach_detach_over_the_socket(load, armed, server, tmp_path):
    pid = os.getpid()
    assert stat.S_IMODE(os.stat(server.path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    r = invoke("ps", "-f", "json")
    assert r.exit_code == 0, r.output
    (proc,) = json.loads(r.stdout)
    assert proc["pid"] == pid and proc["engines"][0]["state"] == "armed"
    r = invoke("ps")
    assert r.exit_code == 0 and str(pid) in r.stdout and "armed" in r.stdout

    load.add(2, tokens=40)
    load.steps(2)
    r = invoke("attach", pid, "--out", tmp_path / "t", "--steps", 5, "--no-wait")
    assert r.exit_code == 0, r.output
    assert "recording engine" in r.stdout
    assert "already recording" in one_line_error(invoke("attach", pid, "--out", tmp_path / "u"))
    first = len(load.live)
    load.steps(8)
    assert_trace_is(tmp_path / "t", load.live[first:first + 5])
    assert "not recording" in one_line_error(invoke("detach", pid))

    r = invoke("attach", pid, "--out", tmp_path / "v", "--redact-prompts")
    assert r.exit_code == 0, r.output
    load.add(1)
    load.steps(3)
    threading.Thread(target=load.drain).start()  # busy: detach waits for a step boundary
    r = invoke("detach", pid)
    assert r.exit_code == 0, r.output
    assert "closed cleanly" in r.stdout
    (e,) = open_trace(tmp_path / "v").engines
    assert e.manifest["redacted_prompts"] is True
    assert e.manifest["started_by"] == "vllm-contract attach"


def test_cli_bad_input(server, tmp_path):
    pid = os.getpid()
    assert "not both" in one_line_error(invoke("attach", pid, "--out", tmp_path, "--steps", 2,
                                               "--seconds", 1))
    assert "--max-trace-bytes" in one_line_error(invoke("attach", pid, "--out", tmp_path,
                                                        "--max-trace-bytes", "lots"))
    f = tmp_path / "f"
    f.write_text("")
    assert "not a directory" in one_line_error(invoke("attach", pid, "--out", f))
    assert "no process" in one_line_error(invoke("attach", 2 ** 22 + 12345, "--out", tmp_path))
    assert "not an armed vLLM engine" in one_line_error(invoke("detach", 1))
    os.chmod(server.path.parent, 0o755)
    try:
        assert "must be 0700" in one_line_error(invoke("ps"))
    finally:
        os.chmod(server.path.parent, 0o700)
    # The socket protocol checks what other tools send, too.
    for bad, words in (({"cmd": "start", "out": "rel/dir"}, "absolute path"),
                       ({"cmd": "start", "out": str(tmp_path), "steps": "5"}, "'steps'"),
                       ({"cmd": "start", "out": str(tmp_path), "seconds": -1}, "'seconds'"),
                       ({"cmd": "start", "out": str(tmp_path),
                         "options": {"VLLM_CONTRACT_ON_FULL": "wait"}}, "ON_FULL"),
                       ({"cmd": "reboot"}, "unknown command")):
        reply = server.handle(bad)
        assert reply["ok"] is False and words in reply["error"], (bad, reply)


NOBODY = textwrap.dedent("""
    import json, os, socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1])
    except OSError as e:
        print(json.dumps({"uid": os.getuid(), "connect": e.strerror}))
        sys.exit(0)
    try:
        s.sendall(b'{"cmd": "start", "out": "/tmp/nobody-trace"}\\n')
    except BrokenPipeError:  # refused before it could ask: the refusal is there to read
        pass
    print(json.dumps({"uid": os.getuid(), "reply": s.makefile().readline()}))
""")


def _as_nobody(path: Path) -> dict:
    setpriv = shutil.which("setpriv")
    assert setpriv, "this test needs setpriv (util-linux) to run a client as another user"
    r = subprocess.run([setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        sys.executable, "-I", "-c", NOBODY, str(path)],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_socket_refuses_another_uid(armed, server):
    assert os.getuid() == 0, "run as root to switch to nobody"  # the suite runs as root here
    # The run dir (0700) keeps other users out before they reach the socket...
    got = _as_nobody(server.path)
    assert got["uid"] == 65534 and got["connect"] == "Permission denied", got
    # ...and if someone loosens it, the peer-credential check still refuses them.
    os.chmod(server.path.parent, 0o711)
    os.chmod(server.path, 0o666)
    got = _as_nobody(server.path)
    reply = json.loads(got["reply"])
    assert reply["ok"] is False and reply["error"].startswith("refused: uid 65534"), reply
    assert armed.recorder is None and armed._start is None  # nothing was started
    assert not Path("/tmp/nobody-trace").exists()
    # The CLI, meanwhile, says no to the loosened directory.
    assert "must be 0700" in one_line_error(invoke("ps"))
