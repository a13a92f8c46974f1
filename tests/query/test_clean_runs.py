"""The catalog is silent on every clean run of the real scheduler and engine: no error or
warning finding, with one batch in flight or two."""

from __future__ import annotations

from __future__ import annotations


import pytest

from vllm_contract import schema
from vllm_contract.recorder.compact import compact
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.trace import open_trace
from vllm_contract.recorder.clock import now_ns
from vllm_contract.rig import scenarios

from checking import (CLEAN, OVERLAPPED, edit, findings, hits, patched,
                      serious)


@pytest.mark.parametrize("name,batch_queue", [(n, 1) for n in CLEAN] + OVERLAPPED)
def test_clean_scenarios_have_no_errors_or_warnings(name, batch_queue, tiny_model, tmp_path):
    h = scenarios.run(name, tiny_model, tmp_path, batch_queue=batch_queue)
    assert (h.overlapped > 0) == (batch_queue > 1)
    report = findings(tmp_path)
    assert not report.skipped
    assert serious(report) == [], [f.message for f in serious(report)]
    # the checks that hold only with batches in flight or a drafter know which engines have them
    with Gateway(tmp_path) as gw:
        (e,) = gw.sql("SELECT async_scheduling, spec_method, num_speculative_tokens "
                      "FROM engines").to_pylist()
    drafts = scenarios.SCENARIOS[name].config.num_spec_tokens
    assert e == {"async_scheduling": batch_queue > 1, "spec_method": "ngram" if drafts else None,
                 "num_speculative_tokens": drafts or None}


def test_wall_clock_set_back_keeps_the_order_of_calls(tiny_model, tmp_path, monkeypatch):
    """The wall clock set back an hour in the middle of a run (NTP, a resumed VM) with batches
    in flight and rejected drafts: the recorded times still order the engine's calls as they
    happened, which finished.leaked and computed.progress read."""
    import time

    real = time.time_ns
    hour = 3600 * 10**9
    stepped = {"at": None, "n": 0}

    def wall_clock() -> int:
        return real() - (hour if stepped["at"] is not None else 0)

    def on_schedule(so) -> None:
        stepped["n"] += 1
        if stepped["n"] == 6:
            stepped["at"] = real()
            stepped["recorder"] = now_ns()  # the recorder's clock, which slews apart from it

    monkeypatch.setattr(time, "time_ns", wall_clock)
    h = scenarios.run("spec_decode", tiny_model, tmp_path, on_schedule=on_schedule,
                      batch_queue=2)
    assert h.overlapped > 0 and time.time_ns() < real() - hour // 2  # it was set back
    monkeypatch.undo()

    t = open_trace(tmp_path)
    scheduled = {r["step"]: r["t_ns"] for r in t.read("steps").to_pylist()}
    updated = {r["step"]: r["t_ns"] for r in t.read("updates").to_pylist()}
    steps = sorted(scheduled)
    assert len(steps) > 10
    # schedule() calls in step order; each update after its own schedule() and before the
    # schedule() two steps on (a queue of two batches); everything after the setback still
    # counts as after what came before it
    assert all(scheduled[a] < scheduled[b] for a, b in zip(steps, steps[1:]))
    assert all(scheduled[s] < updated[s] for s in updated)
    assert all(updated[s] < scheduled[s + 2] for s in updated if s + 2 in scheduled)
    assert max(scheduled.values()) > stepped["recorder"]
    report = findings(tmp_path)
    assert serious(report) == [], [f.message for f in serious(report)]


def test_clean_real_engine_run_has_no_errors_or_warnings(cpu_llm, tmp_path):
    from vllm_contract.recorder import attach
    from vllm_contract.rig.engine import demo_workload, scheduler_of

    with attach(scheduler_of(cpu_llm), tmp_path):
        demo_workload(cpu_llm)
    report = findings(tmp_path)
    assert serious(report) == [], [f.message for f in serious(report)]
    # the never-scheduled abort (req-7) is the one info finding a correct scheduler produces
    assert [r for _, r in hits(report, "finished.phantom")] == [
        r for r in open_trace(tmp_path).read("finished")["req_id"].to_pylist()
        if r.startswith("req-7-")]



@pytest.mark.parametrize("split", [True, False], ids=["one-engine-at-a-time", "grouped"])
def test_engines_in_one_root_are_checked_apart(tiny_model, tmp_path, monkeypatch, split):
    """Two engines that ran the same requests (so the same ids) under one root, one of them
    broken in one step, one compacted and one still live: each engine's findings and derived
    views are what they are for that engine alone, whether the views' passes run one engine at
    a time or group by engine (as they do beyond views.PER_ENGINE_UP_TO engines)."""
    from vllm_contract.replay.query import views as view_sql

    monkeypatch.setattr(view_sql, "PER_ENGINE_UP_TO", 2 if split else 1)
    import shutil

    def bump(so, step):
        if step == 3:
            so.total_num_scheduled_tokens += 1
            return step, None

    scenarios.run("preemption", tiny_model, tmp_path / "a")
    patched(tiny_model, tmp_path / "b", "preemption", bump)
    compact(open_trace(tmp_path / "b"))
    root = tmp_path / "root"
    alone = {}
    for name in ("a", "b"):
        (e,) = open_trace(tmp_path / name).engines
        home = root / schema.ENGINES_DIR / f"engine={name}-dp0"
        alone[name] = shutil.copytree(e.dir, home)
        for table in schema.TABLE_NAMES:
            shutil.copytree(schema.table_dir(e.dir, table), schema.table_dir(home, table))
    assert {p.suffix for p in schema.table_dir(alone["a"], "scheduled").iterdir()} == {
        schema.SEGMENT_SUFFIX}
    assert {p.suffix for p in schema.table_dir(alone["b"], "scheduled").iterdir()} == {
        schema.PARQUET_SUFFIX}

    report = findings(root)
    assert [(f.engine, f.step) for f in serious(report)] == [("b-dp0", 3)]
    assert hits(report, "tokens.total_mismatch") == [(3, None)]
    # each view's rows of one engine, without the keys numbered across the whole trace
    views = {v: f"SELECT * EXCLUDE ({drop}) FROM {v} WHERE engine = '{{e}}'" for v, drop in (
        ("step_totals", "engine"), ("grants", "engine"), ("run_groups", "engine, inst"),
        ("instances", "engine, inst"))}
    views["runs"] = ("SELECT k.req_id, r.* EXCLUDE (inst) FROM runs r "
                     "JOIN run_ids k ON k.inst = r.inst WHERE k.engine = '{e}'")
    with Gateway(root) as gw:
        for view, query in views.items():
            for name, one in alone.items():
                got = gw.sql(query.format(e=f"{name}-dp0") + " ORDER BY ALL").to_pylist()
                with Gateway(one) as g1:
                    want = g1.sql(query.format(e=f"{name}-dp0") + " ORDER BY ALL").to_pylist()
                assert got == want and want, f"{view} of engine {name} differs"


def test_overlapping_batches_have_no_errors_or_warnings(tiny_model, tmp_path):
    """A real engine on the batch-queue step path (async scheduling, pipeline parallelism) with
    an AsyncScheduler subclass, over the demo's workload (chunked prefill, preemption, aborts):
    step e + 1 is scheduled before step e's update finishes a request, so the id travels in a
    later step than e + 1, and the last finish may have no step after it at all. Nothing of
    that is an error; a delivery dropped or made late there still is, at the step that was
    due."""
    import subprocess
    import sys

    import live_child  # tests/: the child engine script and how to start it

    trace = tmp_path / "trace"
    (tmp_path / "res").mkdir()
    r = subprocess.run([sys.executable, live_child.PATH, tiny_model, str(tmp_path / "res"),
                        "demo", "x", "--user-async-scheduler", "--batch-queue"],
                       env=live_child.child_env(False, VLLM_CONTRACT_TRACE_DIR=trace),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    t = open_trace(trace)
    returned = {s["step"]: s["t_ns"] for s in t.read("steps").to_pylist()}
    events = [e for e in t.read("finish_events").to_pylist() if e["step"] + 1 in returned]
    # the batches really overlapped: step e + 1 was out before step e's update finished
    overlapped = [e for e in events if returned[e["step"] + 1] < e["t_ns"]]
    assert overlapped, "no finish overlapped the next step: the test proves nothing"
    assert len(t.read("preempted")) > 0
    report = findings(trace)
    assert serious(report) == [], [f.message for f in serious(report)]

    # cut right after the step that was already out when the last overlapped finish came: no
    # step after the finish, so nothing was due yet
    import shutil

    last = max(overlapped, key=lambda e: e["step"])
    cut = tmp_path / "cut"
    shutil.copytree(trace, cut)
    for table in ("steps", "finished"):
        edit(cut, table, lambda rows: [r for r in rows if r["step"] <= last["step"] + 1])
    assert hits(findings(cut), "finished.leaked") == []

    # the step each overlapped finish was due in: the first one returned after the event
    due = {e["req_id"]: min(s for s, at in returned.items() if s > e["step"] and at > e["t_ns"])
           for e in overlapped if any(at > e["t_ns"] for at in returned.values())}
    dropped, late = sorted(due)[:2]
    edit(trace, "finished", lambda rows: [
        dict(r, step=r["step"] + 1) if r["req_id"] == late else r
        for r in rows if r["req_id"] != dropped])
    assert sorted(hits(findings(trace), "finished.leaked")) == sorted(
        [(due[dropped], dropped), (due[late], late)])
