"""The control socket of a real armed vLLM engine (CPU, a process of its own) under abuse: idle
connections held open cost it no threads and are closed, `attach`/`detach` keep working
meanwhile, and numbers that are not finite or out of range are refused with one line, by the
socket and by the CLI."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_contract.recorder import control, settings
from vllm_contract.trace import open_trace

from live.test_live_control import invoke, one_line_error
from live.test_live_engine import CHILD, Child, child_env, cli

IDLE_S = 2.0  # the engine's idle timeout here, lowered so that the test need not wait long


class Engine:
    """The armed child engine; its engine core runs in-process, so the socket is its own."""

    def __init__(self, child: Child, run_dir: Path, results: Path) -> None:
        self.child, self.run_dir, self.results = child, run_dir, results
        self.pid = child.proc.pid
        self.socket = run_dir / f"{self.pid}.sock"
        self.cenv = child_env(False, VLLM_CONTRACT_RUN_DIR=run_dir)

    def threads(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise AssertionError("no Threads: line")

    def generate(self, name: str, n: int) -> dict:
        self.child.proc.stdin.write(f"{name} {n}\n".encode())
        self.child.proc.stdin.flush()
        self.child.wait_for(self.results / f"{name}.json")
        return json.loads((self.results / f"{name}.json").read_text())

    def state(self) -> str:
        (e,) = control.request(self.socket, {"cmd": "info"}, timeout=30)["engines"]
        return e["state"]


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    base = tmp_path_factory.mktemp("ctl")  # 0700, and short enough for a socket path
    res = base / "res"
    res.mkdir()
    env = child_env(False, VLLM_CONTRACT_ARM=1, VLLM_CONTRACT_RUN_DIR=base / "run",
                    **{control.IDLE_TIMEOUT_ENV: IDLE_S})
    child = Child([sys.executable, CHILD, tiny_model, res, "serve"], env, base / "child.log",
                  stdin=subprocess.PIPE)
    try:
        child.wait_for(res / "ready")
        e = Engine(child, base / "run", res)
        child.wait_for(e.socket)
        yield e
        child.proc.stdin.write(b"exit\n")
        child.proc.stdin.close()
        assert child.proc.wait(120) == 0, child.tail()
        log = child.log.read_text(errors="replace")
        assert "vllm-contract: control" not in log, log  # no error of the server's own
    finally:
        child.kill()


def connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    control.connect(s, path, 30)
    return s


def ended(s: socket.socket, said: dict) -> bool:
    """Whether the engine has closed `s`; what it wrote before is collected in said[s]."""
    while select.select([s], [], [], 0)[0]:
        chunk = s.recv(65536)
        if not chunk:
            return True
        said[s] = said.get(s, b"") + chunk
    return False


def one_error_line(data: bytes) -> str:
    lines = data.decode().splitlines()
    assert len(lines) == 1, data
    reply = json.loads(lines[0], parse_constant=lambda c: pytest.fail(f"{c} in {lines[0]}"))
    assert reply["ok"] is False and reply["error"], reply
    return reply["error"]


def hold(path: Path, n: int) -> list[socket.socket]:
    return [connect(path) for _ in range(n)]


def test_idle_connections_cost_no_threads_and_are_closed(engine, tmp_path):
    before = engine.threads()
    held, said = hold(engine.socket, 200), {}
    try:
        time.sleep(0.5)  # let the engine accept them all
        assert engine.threads() <= before + 2, (before, engine.threads())
        # Beyond the limit the oldest silent ones were closed at once, each told why...
        evicted = [s for s in held if ended(s, said)]
        assert len(evicted) == len(held) - control.MAX_CONNECTIONS
        assert all("more than" in one_error_line(said[s]) for s in evicted)
        # ...and the newest are closed by the idle timeout, also with one line.
        idle = [s for s in held if s not in evicted]
        end = time.monotonic() + IDLE_S + 10
        while not all(ended(s, said) for s in idle) and time.monotonic() < end:
            time.sleep(0.1)
        assert all(ended(s, said) for s in idle), "idle connections outlived the timeout"
        assert all(f"no request within {IDLE_S:g} s" in one_error_line(said[s]) for s in idle)
    finally:
        for s in held:
            s.close()
    # With another 200 held, the engine is controlled as usual, and serves.
    held = hold(engine.socket, 200)
    try:
        r = cli("attach", engine.pid, "--out", tmp_path / "t", env=engine.cenv)
        assert r.returncode == 0 and "recording engine" in r.stdout, r.stderr
        generated = engine.generate("a", 2)
        assert engine.threads() <= before + 2, (before, engine.threads())
        r = cli("detach", engine.pid, env=engine.cenv)
        assert r.returncode == 0 and "closed cleanly" in r.stdout, r.stderr
    finally:
        for s in held:
            s.close()
    (t,) = open_trace(tmp_path / "t").engines
    assert t.manifest["closed_cleanly"] is True and len(t.read("steps")) > 0 and generated
    assert engine.threads() <= before + 2
    assert engine.state() == "armed"


def raw(path: Path, data: bytes) -> bytes:
    """What the engine answers a client that sends `data` and nothing else."""
    with connect(path) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got


def test_numbers_that_are_not_finite_or_in_range_are_refused(engine, tmp_path, monkeypatch):
    out = str(tmp_path / "never")
    start = '{"cmd": "start", "out": "%s", %%s}\n' % out
    cases = {  # what the request says -> words of the one-line error
        '"seconds": Infinity': "Infinity", '"seconds": -Infinity': "-Infinity",
        '"seconds": NaN': "NaN", '"seconds": 1e309': "1e309", '"seconds": -1': "'seconds'",
        '"seconds": 0': "'seconds'", '"seconds": "5"': "'seconds'",
        '"seconds": true': "'seconds'", '"seconds": 1e10': "'seconds'",
        '"steps": 2.5': "'steps'", '"steps": 1e3': "'steps'", '"steps": 0': "'steps'",
        '"steps": "5"': "'steps'", '"steps": true': "'steps'",
        '"steps": 10000000000000': "'steps'", '"steps": 1%s' % ("0" * 5000): "digits",
        '"options": {"VLLM_CONTRACT_FLUSH_SECONDS": "inf"}': "FLUSH_SECONDS",
        '"options": {"VLLM_CONTRACT_FLUSH_SECONDS": 1}': "'options'",
    }
    for body, words in cases.items():
        error = one_error_line(raw(engine.socket, (start % body).encode()))
        assert words in error, (body[:60], error)
    too_long = one_error_line(raw(engine.socket, b" " * (control.MAX_REQUEST + 1)))
    assert "longer than" in too_long
    assert engine.state() == "armed" and not Path(out).exists()

    # The CLI refuses the same before it sends anything.
    monkeypatch.setenv(settings.RUN_DIR, str(engine.run_dir))
    for flag, value in (("--seconds", "inf"), ("--seconds", "-inf"), ("--seconds", "nan"),
                        ("--seconds", "1e309"), ("--seconds", "-1"), ("--seconds", "1e10"),
                        ("--steps", "10000000000000"), ("--flush-seconds", "inf"),
                        ("--max-trace-bytes", "9" * 400 + "T")):
        error = one_line_error(invoke("attach", engine.pid, "--out", out, flag, value))
        assert flag in error, (flag, value, error)
    assert engine.state() == "armed" and not Path(out).exists()
    # The largest number of seconds is still a number.
    r = invoke("attach", engine.pid, "--out", out, "--seconds", control.MAX_SECONDS, "--no-wait")
    assert r.exit_code == 0 and "recording engine" in r.stdout, r.output
    r = invoke("detach", engine.pid)
    assert r.exit_code == 0 and "closed cleanly" in r.stdout, r.output
    (t,) = open_trace(out).engines
    assert t.manifest["limits"] == {"steps": None, "seconds": control.MAX_SECONDS}
    assert engine.state() == "armed"
