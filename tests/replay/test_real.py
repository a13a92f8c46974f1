"""Replay into a real vLLM worker (the CPU build): real engine runs, recorded by attach() in this
process or by the plugin in a multiprocess engine, replayed step by step through a second
engine's executor with its scheduler bypassed. Tokens are compared with what the recording
engine really emitted; altered and broken traces are edits of real recordings, named as such."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

import pytest

import live_child
from checking import alter_one_token, edit, edit_manifest
from readerkit import assert_clean_failure, copy_engine, engine_dir, invoke
from vllm_contract.recorder import attach
from vllm_contract.replay.session import Session
from vllm_contract.replay.worker import vllm_driver as real
from vllm_contract.replay.worker.plan import plan
from vllm_contract.rig.engine import demo_workload, params, scheduler_of
from vllm_contract.rig.scenarios import prompt
from vllm_contract.trace import open_trace

REPLAY_BLOCKS = 16  # every trace here was recorded with DEMO_ENGINE (8 blocks)


def _engine(path: Path):
    (e,) = open_trace(path).engines
    return e


DEMO_ABORTS = ("req-1", "req-7")  # demo_workload aborts these at its sixth step


def _assert_same_tokens(got: dict[str, list[int]], emitted: dict[str, list[int]],
                        aborted=DEMO_ABORTS) -> None:
    """Replayed tokens per internal id (with vLLM's random suffix) against what the engine
    emitted per external id; requests that never sampled a token on either side aside. An
    aborted request may have sampled one token more than its caller saw (the abort reaches the
    engine between the step and its output)."""
    got = {rid.rsplit("-", 1)[0]: t for rid, t in got.items() if t}
    emitted = {rid: t for rid, t in emitted.items() if t}
    assert set(got) == set(emitted)
    for rid, toks in got.items():
        if rid in aborted:
            assert toks[:len(emitted[rid])] == emitted[rid] and len(toks) - len(emitted[rid]) <= 1
        else:
            assert toks == emitted[rid], rid


def _emitted_by_step(e) -> dict[str, list[int]]:
    out = defaultdict(list)
    for r in sorted(e.read("model_outputs").to_pylist(), key=lambda r: (r["step"], r["pos"])):
        out[r["req_id"]].extend(r["sampled_token_ids"] or [])
    return out


@pytest.fixture(scope="module")
def demo(cpu_llm, tmp_path_factory):
    """The demo workload (chunked prefill, preemption, aborts, seeded greedy requests) recorded
    in this process; with the tokens generate() returned per external id."""
    d = tmp_path_factory.mktemp("demo")
    with attach(scheduler_of(cpu_llm), d):
        tokens = demo_workload(cpu_llm)
    return d, tokens


@pytest.fixture(scope="module")
def sampled(cpu_llm, tmp_path_factory):
    """Random sampling (temperature 0.9): three requests with a seed, two without. Prompts fit
    one step's token budget together: vLLM's CPU worker raises on a seeded request whose
    prefill is chunked (its CPU generator has no offset to rewind)."""
    d = tmp_path_factory.mktemp("sampled")
    engine = cpu_llm.llm_engine
    with attach(scheduler_of(cpu_llm), d):
        for i in range(5):
            seed = i if i < 3 else None
            engine.add_request(f"s-{i}", {"prompt_token_ids": prompt(40 + i, 16 + 4 * i)},
                               params(40, temperature=0.9, seed=seed))
        while engine.has_unfinished_requests():
            engine.step()
    return d


@pytest.fixture(scope="module")
def replay_llm(demo):
    """One replay engine for the module, sized for every trace here (a VllmDriver frees what
    the previous one left before it starts)."""
    p = plan(_engine(demo[0]))
    p = dataclasses.replace(p, kv_blocks=REPLAY_BLOCKS,
                            options={**p.options, "num_gpu_blocks_override": REPLAY_BLOCKS})
    return real.build_llm(p)


def _replay(path: Path, llm, force: bool = False, **kw):
    """Every step; the tokens the worker sampled per request, and the worker."""
    w = real.VllmDriver(plan(_engine(path), **kw), llm=llm, force=force)
    got = defaultdict(list)
    while not w.done:
        w.step()
        for rid, (_, g) in w.last.items():
            got[rid].extend(g or [])
    return w, got


def test_demo_replays_token_for_token(demo, replay_llm):
    d, emitted = demo
    e = _engine(d)
    assert e.read("preempted").num_rows > 0, "no preemption: the workload proves less"
    chunked = [r for r in e.read("scheduled").to_pylist() if r["kind"] == "new"]
    prompts = {r["req_id"]: r["prompt_len"] for r in e.read("requests").to_pylist()}
    assert any(r["num_scheduled_tokens"] < prompts[r["req_id"]] for r in chunked)
    w, got = _replay(d, replay_llm)
    assert w.pos == len(e.read("steps")) and w.divergences == []
    _assert_same_tokens(got, emitted)  # the ones the engine emitted to its caller


def test_seeded_sampling_replays_and_unseeded_is_not_compared(sampled, replay_llm):
    w, got = _replay(sampled, replay_llm)
    nc = w.plan.not_comparable
    assert {r.rsplit("-", 1)[0] for r in nc} == {"s-3", "s-4"}
    assert all("without a seed" in why for why in nc.values())
    assert w.divergences == []
    rec = _emitted_by_step(w.plan.engine)
    for rid in rec:
        if rid not in nc:
            assert got[rid] == rec[rid], rid


def test_forced_tokens_hold_the_recorded_context(sampled, replay_llm):
    """With teacher forcing the worker's cached output of every request, unseeded ones
    included, is the recorded one at every step."""
    e = _engine(sampled)
    w = real.VllmDriver(plan(e), llm=replay_llm, force=True)
    rec = defaultdict(list)
    by_step = defaultdict(dict)
    for r in e.read("model_outputs").to_pylist():
        by_step[r["step"]][r["req_id"]] = r["sampled_token_ids"] or []
    checked = 0
    while not w.done:
        step = w.steps[w.pos]
        w.step()
        for rid, toks in by_step[step].items():
            rec[rid].extend(toks)
        for rid, held in w.state()["held"].items():
            assert held["output_token_ids"] == rec[rid], (step, rid)
            checked += rid in w.plan.not_comparable
    assert checked > 10


def test_altered_token_is_the_first_divergence(demo, replay_llm, tmp_path):
    """A copy of the demo trace with one recorded token changed (an edit, named as such)."""
    step, rid, orig, altered = alter_one_token(demo[0], tmp_path / "t")
    w, _ = _replay(tmp_path / "t", replay_llm)
    assert [dataclasses.astuple(d) for d in w.divergences] == [(step, rid, altered, orig)]
    # forced: the worker takes the altered token, so its context from then on is the recorded
    forced = real.VllmDriver(plan(_engine(tmp_path / "t")), llm=replay_llm, force=True)
    forced.goto(forced.steps.index(step) + 1)
    assert forced.divergences[0].step == step
    assert forced.state()["held"][rid]["output_token_ids"][-1] == altered[0]
    w.goto(w.steps.index(step) + 1)  # back: re-run from the start, unforced
    assert w.state()["held"][rid]["output_token_ids"][-1] == orig[0]


def test_multiprocess_recording_replays(tiny_model, tmp_path, replay_llm):
    """The demo workload in a multiprocess engine (engine core and worker in child processes),
    recorded by the installed plugin from the environment alone."""
    results = tmp_path / "results"
    results.mkdir()
    trace = tmp_path / "trace"
    r = subprocess.run([sys.executable, live_child.PATH, tiny_model, str(results), "demo", "x"],
                       env=live_child.child_env(True, VLLM_CONTRACT_TRACE_DIR=trace),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    e = _engine(trace)
    assert e.manifest["transport"]["executor"] != "UniProcExecutor"
    w, got = _replay(trace, replay_llm)
    assert w.divergences == [] and w.pos == len(e.read("steps"))
    _assert_same_tokens(got, json.loads((results / "x.json").read_text()))


def test_two_batches_in_flight_replay_in_order_and_say_why(tiny_model, tmp_path, replay_llm):
    """An AsyncScheduler stepped by step_with_batch_queue (two batches in flight) on the real
    engine: the replay says that it runs them one at a time, and why, and its tokens match."""
    results = tmp_path / "results"
    results.mkdir()
    trace = tmp_path / "trace"
    r = subprocess.run([sys.executable, live_child.PATH, tiny_model, str(results), "once", "x",
                        "4", "--user-async-scheduler", "--batch-queue", "--greedy"],
                       env=live_child.child_env(False, VLLM_CONTRACT_TRACE_DIR=trace),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    p = plan(_engine(trace))
    (note,) = p.notes
    assert note.startswith("recorded with up to 2 batches in flight")
    assert "one batch at a time" in note
    w, got = _replay(trace, replay_llm)
    assert w.divergences == []
    _assert_same_tokens(got, json.loads((results / "x.json").read_text()))


def _drop_intro(path: Path, prefix: str) -> tuple[int, str]:
    """Edit a real trace: one request's introduction (its NewRequestData) is gone, so the
    next step names a cached request the worker never held."""
    gone: dict = {}

    def scheduled(rows):
        out = []
        for r in rows:
            if not gone and r["kind"] == "new" and r["req_id"].startswith(prefix):
                gone.update(step=r["step"], rid=r["req_id"], n=r["num_scheduled_tokens"])
                continue
            out.append(r)
        return out

    edit(path, "scheduled", scheduled)
    edit(path, "requests", lambda rows: [r for r in rows if (r["step"], r["req_id"])
                                         != (gone["step"], gone["rid"])])

    def steps(rows):
        for r in rows:
            if r["step"] == gone["step"]:
                r["total_num_scheduled_tokens"] -= gone["n"]
        return rows

    edit(path, "steps", steps)
    return gone["step"], gone["rid"]


def test_crash_is_refused_then_reported_from_a_child(demo, tmp_path):
    import shutil

    shutil.copytree(demo[0], tmp_path / "t")
    intro, rid = _drop_intro(tmp_path / "t", "req-3")
    # the shared engine may have begun this recording owing its worker a finished id (marked
    # mid-stream); the edit is of a trace recorded from the start, so say so
    edit_manifest(tmp_path / "t", attached_mid_stream=False)
    r = invoke("replay", tmp_path / "t", "--worker", "vllm", "-f", "json")
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    first = out["first"]
    assert (first["invariant"], first["req_id"]) == ("replay.would_crash", rid)
    assert first["step"] > intro and out["steps_replayed"] == first["step"]
    assert "worker.unknown_cached" in first["message"] and out["crash"] is None
    r = invoke("replay", tmp_path / "t", "--worker", "vllm", "--allow-crash", "-f", "json")
    assert r.exit_code == 1, r.output
    crashed = json.loads(r.stdout)
    assert crashed["first"]["invariant"] == "replay.crash"
    assert crashed["crash"]["step"] == first["step"]
    assert f"KeyError: '{rid}'" in crashed["crash"]["traceback"]
    # the same worker stepped at will: the crash stops it, going back starts it again
    s = Session(tmp_path / "t", worker="vllm", allow_crash=True)
    try:
        assert s.run() and s.steps[s.position] == first["step"]
        assert s.worker.stopped and s.worker.crash["step"] == first["step"]
        assert [f.invariant for f in s.findings] == ["replay.crash"]
        assert not s.step().applied and s.steps[s.position] == first["step"]
        s.goto(3)
        assert s.position == 3 and not s.worker.stopped and s.findings == []
        assert set(s.state()["held"]) and s.divergences == []
    finally:
        s.close()


def test_session_steps_back_and_agrees_with_the_shadow(demo, replay_llm):
    s = Session(demo[0], worker="vllm", llm=replay_llm)
    shadow = Session(demo[0])
    for n in (40, 25, 41):
        s.goto(n)
        shadow.goto(n)
        assert s.position == n
        # the requests vLLM's worker caches are the ones the shadow worker models
        assert set(s.state()["held"]) == set(shadow.state()["requests"]), n
    s.back()
    assert s.position == 40
    assert s.run() and s.position == len(s.steps) and s.divergences == []


def test_cli_json_on_a_clean_run(demo):
    r = invoke("replay", demo[0], "--worker", "vllm", "--until", "60", "-f", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["worker"] == "vllm" and out["steps_replayed"] == 61
    assert out["first"] is None and out["divergences"] == [] and out["crash"] is None


@pytest.fixture(scope="module")
def attached_hits(cpu_llm, tmp_path_factory):
    """An engine that served a request before attach() (idle at the attach), then requests
    whose prompts share that request's prefix: the real scheduler introduces them with
    prefix-cache hits on blocks computed before the recording began."""
    d = tmp_path_factory.mktemp("attached-hits")
    engine = cpu_llm.llm_engine
    base = prompt(90, 300)
    engine.add_request("before", {"prompt_token_ids": base}, params(4))
    while engine.has_unfinished_requests():
        engine.step()
    asks = {"hit-2": base[:256] + prompt(91, 30), "hit-1": base[:128] + prompt(92, 60),
            "fresh": prompt(93, 50)}
    emitted = {}
    with attach(scheduler_of(cpu_llm), d):
        for rid, toks in asks.items():
            engine.add_request(rid, {"prompt_token_ids": toks}, params(24))
        while engine.has_unfinished_requests():
            for out in engine.step():
                emitted[out.request_id] = list(out.outputs[0].token_ids)
    return d, emitted


def test_prefix_hits_from_before_an_attach_are_warmed_and_compared(attached_hits, replay_llm):
    d, emitted = attached_hits
    e = _engine(d)
    # idle at the attach: no request held, only the last one's finished id still owed
    assert e.manifest["worker_state_at_start"]["requests"] == 0
    hits = {r["req_id"].rsplit("-", 1)[0]: r["num_computed_tokens"]
            for r in e.read("scheduled").to_pylist() if r["kind"] == "new"}
    assert hits == {"hit-2": 256, "hit-1": 128, "fresh": 0}, hits
    blocks = {r["req_id"].rsplit("-", 1)[0]: r["new_block_ids"][0]
              for r in e.read("scheduled").to_pylist() if r["kind"] == "new"}
    # hit-1's one hit block is hit-2's first: warming hit-2 (introduced first) fills it
    assert blocks["hit-1"][0] == blocks["hit-2"][0]
    w, got = _replay(d, replay_llm)
    assert w.divergences == [] and w.not_comparable == {}
    assert {rid.rsplit("-", 1)[0]: n for rid, n in w.warmed.items()} == {"hit-2": 256}
    _assert_same_tokens(got, emitted, aborted=())
    # the command line says so, and the shadow worker finds nothing either
    r = invoke("replay", d, "--worker", "vllm", "-f", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["divergences"] == [] and out["not_comparable"] == {}
    assert list(out["warmed"].values()) == [256]
    assert any("prefilled into its blocks first" in n for n in out["notes"])
    # the finished id owed at the attach is not a phantom: only the mid-stream note remains
    r = invoke("check", d, "--worker", "shadow", "-f", "json")
    assert r.exit_code == 0, r.output
    assert [f["invariant"] for f in json.loads(r.stdout)] == ["trace.attached_mid_stream"]


def test_mid_stream_recording_names_where_a_replay_can_start(cpu_llm, tmp_path):
    """attach() to the engine while the demo workload runs: the fresh worker would meet
    requests it never saw."""
    stack = ExitStack()

    def on_step(n: int) -> None:
        if n == 5:
            stack.enter_context(attach(scheduler_of(cpu_llm), tmp_path / "t"))

    with stack:
        demo_workload(cpu_llm, on_step=on_step)
    e = _engine(tmp_path / "t")
    assert e.manifest["attached_mid_stream"] is True
    line = assert_clean_failure(invoke("replay", tmp_path / "t", "--worker", "vllm"))
    assert "begins mid-stream" in line
    if "could start from step" in line:
        start = line.rsplit("--from ", 1)[1].rstrip(")")
        r = invoke("replay", tmp_path / "t", "--worker", "vllm", "--from", start,
                   "--until", int(start) + 20)
        assert r.exit_code == 0, r.output
        assert "note: the recording began mid-stream" in r.stderr
    else:
        assert "no step of this trace can start a replay: replay it with --worker shadow" in line
    # the same note from the shadow worker; requests held from before the attach (scheduled
    # as cached before their id is freed) are no phantom finished ids
    r = invoke("replay", tmp_path / "t")
    assert "note: the recording began mid-stream" in r.stderr, r.output
    held = {x["req_id"] for x in e.read("scheduled").to_pylist() if x["kind"] != "new"}
    r = invoke("check", tmp_path / "t", "-f", "json")
    phantoms = {f["req_id"] for f in json.loads(r.stdout) if f["invariant"] == "finished.phantom"}
    assert held and not phantoms & held, phantoms


@pytest.mark.parametrize("change,expect", [
    ("model", "does not exist here: point at a copy of it with --model PATH"),
    ("redacted", "recorded with redacted prompts"),
    ("drift", "differs from the trace's"),
    ("speculative", "speculative decoding"),
    ("engines", "choose one with --engine"),
    ("inside", "a replay could start from step"),
])
def test_unusable_input_is_one_line_and_exit_2(demo, tmp_path, change, expect):
    import shutil

    t = tmp_path / "t"
    shutil.copytree(demo[0], t)
    args = []
    if change == "model":
        edit_manifest(t, model=str(tmp_path / "gone"))
    elif change == "redacted":
        edit_manifest(t, redacted_prompts=True)
    elif change == "drift":
        m = json.loads((engine_dir(t) / "manifest.json").read_text())
        edit_manifest(t, fields={**m["fields"], "NewRequestData":
                                 m["fields"]["NewRequestData"] + ["a_future_field"]})
    elif change == "speculative":
        edit_manifest(t, speculative={"method": "ngram", "num_speculative_tokens": 2})
    elif change == "engines":
        copy_engine(t, "other")
    else:
        args = ["--from", "5"]
    line = assert_clean_failure(invoke("replay", t, "--worker", "vllm", *args))
    assert expect in line, line


def test_model_option_points_at_a_copy(demo, tmp_path, tiny_model):
    import shutil

    t = tmp_path / "t"
    shutil.copytree(demo[0], t)
    edit_manifest(t, model=str(tmp_path / "moved"))
    shutil.copytree(tiny_model, tmp_path / "copy")
    r = invoke("replay", t, "--worker", "vllm", "--model", tmp_path / "copy", "--until", "10")
    assert r.exit_code == 0, r.output
    assert "11 of 11 step(s) replayed" in r.stdout


def test_structured_output_is_named_not_comparable(tiny_model, tmp_path):
    """The real scheduler with two requests under an xgrammar grammar: the trace holds no
    bitmask, so a replay says it samples them unconstrained instead of comparing them."""
    from vllm_contract.rig import scenarios

    scenarios.run("structured_output", tiny_model, tmp_path)
    e = _engine(tmp_path)
    constrained = {r["req_id"] for r in e.read("requests").to_pylist()
                   if json.loads(r["sampling_params"]).get("structured_outputs")}
    assert len(constrained) == 2
    nc = plan(e).not_comparable
    assert set(nc) == constrained
    assert all("no grammar bitmask" in why for why in nc.values())
