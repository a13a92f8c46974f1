"""The README's served-engine recipe, run as written: the block after the `serve-recipe` marker
in README.md. Its server starts on 127.0.0.1 (the port swapped for a free one, `my-trace` for a
temporary directory), answers the README's request and a few more (one streamed, one stream
its client cancels mid-way) sent with the standard library, stops on SIGINT to its process
group (what Ctrl-C in its terminal sends), and the README's `check` finds nothing; `resim`
re-makes every decision of the server's scheduler. The server's log says when recording
started and stopped. Real CPU vLLM, nothing mocked."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from vllm_contract.trace import open_trace

import live_child  # tests/: the environment a child engine gets
import resimkit

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- serve-recipe:"


def recipe() -> list[str]:
    """The recipe's commands: its fenced block, continuation lines joined, comments left out."""
    text = (ROOT / "README.md").read_text()
    start = text.index(MARKER)
    block = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert block, "README.md: no ```sh block after the serve-recipe marker"
    joined = block.group(1).replace("\\\n", " ")
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.startswith("#")]


def one(commands: list[str], word: str) -> str:
    found = [c for c in commands if word in c]
    assert len(found) == 1, f"the README's recipe should have one command with {word!r}: {found}"
    return found[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def idle(trace: Path, answers: dict) -> bool:
    """On disk: every answered request's finished id handed to the worker, and every step
    answered. Nothing is asked of the engine after that, so it is idle."""
    try:
        (engine,) = open_trace(trace).engines
        finished = engine.read("finished")["req_id"].to_pylist()
        steps = engine.read("steps")["step"].to_pylist()
        updates = set(engine.read("updates")["step"].to_pylist())
    except Exception:  # not flushed yet
        return False
    return (all(any(f.startswith(rid + "-") for f in finished) for rid in answers)
            and bool(steps) and set(steps) <= updates)


def steps_on_disk(trace: Path) -> int:
    try:
        (engine,) = open_trace(trace).engines
        return engine.read("steps").num_rows
    except Exception:  # not flushed yet
        return -1


def sampled(engine) -> dict[str, int]:
    """The tokens the engine made, by the engine's request id."""
    counts: dict[str, int] = {}
    for row in engine.read("model_outputs").to_pylist():
        counts[row["req_id"]] = counts.get(row["req_id"], 0) + len(row["sampled_token_ids"])
    return counts


def outputs_on_disk(trace: Path, rid: str) -> int:
    """The tokens the engine made for the request the server answered as `rid`, flushed; -1
    where the trace cannot be read yet."""
    try:
        (engine,) = open_trace(trace).engines
        counts = sampled(engine)
    except Exception:  # not flushed yet
        return -1
    return sum(n for req_id, n in counts.items() if req_id.startswith(rid + "-"))


def settle(trace: Path, answers: dict, server: subprocess.Popen, tail) -> None:
    """Until the engine is idle on disk for `answers`, and still so a second later (an abort's
    own steps are done)."""
    end = time.time() + 60
    while True:
        while not idle(trace, answers):
            assert server.poll() is None and time.time() < end, tail()
            time.sleep(0.2)
        before = steps_on_disk(trace)
        time.sleep(1.0)
        if idle(trace, answers) and steps_on_disk(trace) == before:
            return


LONG, CANCEL_TRIES = 480, 5  # the cancelled stream's tokens (the model's 512 less its prompt)


def cancel_mid_stream(port: int, path: str, body: dict) -> str:
    """A stream of LONG tokens whose client goes away after three chunks; its id."""
    long = {**body, "prompt": "cancel me", "max_tokens": LONG, "ignore_eos": True,
            "stream": True}
    r = urllib.request.urlopen(post(port, path, long), timeout=60)
    got = []
    for raw in r:
        line = raw.decode().strip()
        if line.startswith("data: "):
            got.append(json.loads(line[6:]))
            if len(got) == 3:
                break
    r.close()
    return got[0]["id"]


def post(port: int, path: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                  {"Content-Type": "application/json"})


def test_readme_serve_recipe_records_a_clean_trace(tiny_model, tmp_path):
    trace, port = tmp_path / "my-trace", _free_port()
    commands = recipe()
    # The recipe as written but for the port, the trace's place, and the virtual env: the one
    # running these tests (`.venv` under `make test`).
    venv = str(Path(sys.prefix)) + "/"

    def adapt(cmd: str) -> str:
        cmd = cmd.replace("my-trace", shlex.quote(str(trace))).replace(".venv/", venv)
        return re.sub(r"(--port |127\.0\.0\.1:)8000\b", rf"\g<1>{port}", cmd)

    activate, model_line = adapt(commands[0]), adapt(commands[1])
    assert activate.startswith(". ") and model_line.startswith("MODEL=$(")
    serve = adapt(one(commands, "vllm.entrypoints.openai.api_server"))
    curl = one(commands, "curl ")
    check = adapt(one(commands, "vllm-contract check"))
    assert "--host 127.0.0.1" in serve and f"--port {port}" in serve

    # The user's shell: none of our settings, vLLM's default log level (conftest lowers it).
    env = live_child.child_env(True, VLLM_LOGGING_LEVEL="INFO")
    env.pop("VLLM_CONTRACT_CACHE", None)  # the recipe names the cache itself
    log = tmp_path / "server.log"
    server = subprocess.Popen(["bash", "-c", f"{activate}\n{model_line}\n{serve}"], cwd=ROOT,
                              env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                              start_new_session=True)

    def tail() -> str:
        return log.read_text(errors="replace")[-4000:]

    try:
        end = time.time() + 300
        while True:
            assert server.poll() is None, f"the server exited ({server.returncode}):\n{tail()}"
            assert time.time() < end, f"the server did not answer /health:\n{tail()}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)

        # The README's request, as its curl line sends it.
        m = re.search(r"curl -s (127\.0\.0\.1):8000(/\S+) .*-d '(\{.*\})'", curl)
        assert m, curl
        readme_body = json.loads(m.group(3))
        answers = {}
        for body in (readme_body, {**readme_body, "prompt": "the contract", "max_tokens": 8},
                     {**readme_body, "prompt": "a b c", "max_tokens": 12, "temperature": 0}):
            with urllib.request.urlopen(post(port, m.group(2), body), timeout=60) as r:
                a = json.load(r)
            answers[a["id"]] = a["usage"]
        streamed = {**readme_body, "prompt": "streamed", "max_tokens": 10, "stream": True,
                    "stream_options": {"include_usage": True}}
        chunks, text = [], ""
        with urllib.request.urlopen(post(port, m.group(2), streamed), timeout=60) as r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        assert chunks and chunks[-1]["usage"], chunks[-1:]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        answers[chunks[0]["id"]] = chunks[-1]["usage"]
        assert text and len(answers) == 4
        # A client that goes away mid-stream: the server aborts its request in the engine.
        # The tiny model can make all its tokens before a server short of CPU notices the
        # client gone: then the stream is tried again (its request stays in the trace,
        # finished); on a box kept busy by other work all the tries can run to their end.
        cancelled = []
        for _ in range(CANCEL_TRIES):
            cancelled.append(cancel_mid_stream(port, m.group(2), readme_body))
            # A person presses Ctrl-C at an idle server, not in the instant between the last
            # answer and the step that hands its finished id to the worker: a SIGINT mid-step
            # stops vLLM's worker before it answers, and its engine core, waiting, is killed.
            settle(trace, {**answers, **dict.fromkeys(cancelled)}, server, tail)
            if 0 <= outputs_on_disk(trace, cancelled[-1]) < LONG:
                break
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C in the server's terminal
        server.wait(120)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
    out = log.read_text(errors="replace")

    # The README's check, as written: exit 0 and nothing found, not even a warning.
    r = subprocess.run(["bash", "-c", f"{activate}\n{check}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "vllm-contract: warning" not in r.stderr, r.stderr
    r = subprocess.run(["bash", "-c", f"{activate}\n{check} --fail-on info -f json"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout + r.stderr

    # Every request is in the trace, with the tokens the server said it generated.
    (engine,) = open_trace(trace).engines
    m = engine.manifest
    assert m["closed_cleanly"] is True and m["started_by"] == "VLLM_CONTRACT_TRACE_DIR"
    requests = {row["req_id"]: row for row in engine.read("requests").to_pylist()}
    made = sampled(engine)
    assert len(requests) == len(answers) + len(cancelled) and len(answers) == 4
    for rid, usage in answers.items():
        (req_id,) = [k for k in requests if k.startswith(rid + "-")]
        assert requests[req_id]["prompt_len"] == usage["prompt_tokens"]
        assert made[req_id] == usage["completion_tokens"]
    # The cancelled stream: aborted in the engine before its LONG tokens, with its abort
    # recorded (a try the engine finished first ran to its end).
    gone = [next(k for k in requests if k.startswith(c + "-")) for c in cancelled]
    aborted = [g for g in gone if made[g] < LONG]
    assert aborted, f"all {len(gone)} cancelled streams ran to their end: {made}"
    assert all(made[g] >= 3 for g in aborted), made
    finishes = {(f["req_id"], f["reason"], f["source"])
                for f in engine.read("finish_events").to_pylist()}
    assert all((g, "FINISHED_ABORTED", "finish_requests") in finishes for g in aborted)
    # The server's scheduler re-run on the recording: every decision the same, the abort
    # fed where the server made it.
    resimkit.assert_re_runs_identically(trace)

    # The server's log says recording is on, where and for which engine, and when it stopped;
    # vLLM's warning about our variable is gone.
    name, core = engine.name, m["pid"]
    assert (f"vllm-contract: recording engine {name} (pid {core}) into {trace} "
            f"(VLLM_CONTRACT_TRACE_DIR)") in out, out
    assert f"vllm-contract: engine armed (pid {core}, dp rank 0; VLLM_CONTRACT_TRACE_DIR)" in out
    stopped = [ln for ln in out.splitlines()
               if f"vllm-contract: stopped recording engine {name} into {trace} after" in ln]
    assert len(stopped) == 1 and stopped[0].endswith(
        f"after {m['steps_recorded']} steps (engine shutdown)"), stopped
    assert f"vllm-contract: engine shut down (pid {core}, dp rank 0): no longer armed" in out
    assert "Unknown vLLM environment variable detected: VLLM_CONTRACT" not in out, out
