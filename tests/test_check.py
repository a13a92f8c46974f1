"""The invariant catalog on real traces: silent on every clean run, and each invariant found,
at the right step and request, when a real recording is broken the way a scheduler bug would
break it.

Breaks come two ways. "patch": the real Scheduler runs and its SchedulerOutput is altered right
after schedule() returns, before the recorder sees it (the bug is in the scheduler, the trace is
real). "edit": a clean recorded trace is compacted and one table or the manifest is rewritten
(for breaks that would derail the scheduler itself, or that concern the recorder)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from vllm_contract import schema
from vllm_contract.cli import app
from vllm_contract.recorder.compact import compact
from vllm_contract.replay import catalog, checker
from vllm_contract.replay.gateway import Gateway
from vllm_contract.replay.trace import open_trace
from vllm_contract.rig import scenarios

CLEAN = [n for n in scenarios.SCENARIOS if n != "long_run"]
# and with two batches in flight (the AsyncScheduler's step path)
OVERLAPPED = [(n, 2) for n in CLEAN]


def findings(path, only=None):
    with Gateway(path) as gw:
        invs = checker.select(catalog.load(), only)
        return checker.run(gw, invs)


def serious(report):
    return [f for f in report.findings if f.severity in ("error", "warning")]


def hits(report, invariant):
    return [(f.step, f.req_id) for f in report.findings if f.invariant == invariant]


# -- zero false positives ---------------------------------------------------------------------
@pytest.mark.parametrize("name,batch_queue", [(n, 1) for n in CLEAN] + OVERLAPPED)
def test_clean_scenarios_have_no_errors_or_warnings(name, batch_queue, tiny_model, tmp_path):
    h = scenarios.run(name, tiny_model, tmp_path, batch_queue=batch_queue)
    assert (h.overlapped > 0) == (batch_queue > 1)
    report = findings(tmp_path)
    assert not report.skipped
    assert serious(report) == [], [f.message for f in serious(report)]


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
    assert max(scheduled.values()) > stepped["at"]
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



def test_engines_in_one_root_are_checked_apart(tiny_model, tmp_path):
    """Two engines that ran the same requests (so the same ids) under one root, one of them
    broken in one step, one compacted and one still live: each engine's findings and derived
    views are what they are for that engine alone (the views group one engine at a time)."""
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
        alone[name] = shutil.copytree(e.dir, root / f"engine={name}-dp0")
    assert {p.suffix for p in (alone["a"] / "scheduled").iterdir()} == {schema.SEGMENT_SUFFIX}
    assert {p.suffix for p in (alone["b"] / "scheduled").iterdir()} == {schema.PARQUET_SUFFIX}

    report = findings(root)
    assert [(f.engine, f.step) for f in serious(report)] == [("engine=b-dp0", 3)]
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
                got = gw.sql(query.format(e=f"engine={name}-dp0") + " ORDER BY ALL").to_pylist()
                with Gateway(one) as g1:
                    want = g1.sql(query.format(e=one.name) + " ORDER BY ALL").to_pylist()
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


# -- helpers ----------------------------------------------------------------------------------
def patched(tiny_model, tmp_path, name, mutate, **writer):
    """Run scenario `name`, letting mutate(so, step) break each SchedulerOutput; returns the
    list of (step, req_id) that mutate reported breaking."""
    broken = []
    state = {"step": 0}

    def on_schedule(so):
        hit = mutate(so, state["step"])
        if hit:
            broken.append(hit)
        state["step"] += 1

    scenarios.run(name, tiny_model, tmp_path, on_schedule=on_schedule, **writer)
    assert broken, "the patch never applied: the test proves nothing"
    return broken


def edit(path: Path, table: str, fn) -> None:
    """Rewrite one table of a (single-engine) trace: rows -> fn(rows)."""
    t = open_trace(path)
    compact(t)
    (e,) = t.engines
    rows = fn(e.read(table).to_pylist())
    for p in (e.dir / table).glob("*.parquet"):
        p.unlink()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.schema(table)),
                   e.dir / table / "000000.parquet")


def edit_manifest(path: Path, **changes) -> None:
    (e,) = open_trace(path).engines
    m = json.loads((e.dir / "manifest.json").read_text())
    for k, v in changes.items():
        if k in m.get("engine", {}):
            m["engine"][k] = v
        else:
            m[k] = v
    (e.dir / "manifest.json").write_text(json.dumps(m))


def cached_ids(so):
    return list(so.scheduled_cached_reqs.req_ids)


# -- breaks by patching the real scheduler's output -------------------------------------------
def test_leaked_finished_ids(tiny_model, tmp_path):
    def drop_finished(so, step):
        if so.finished_req_ids and step < 60:
            rid = sorted(so.finished_req_ids)[0]
            so.finished_req_ids.discard(rid)
            return step, rid

    broken = patched(tiny_model, tmp_path, "preemption", drop_finished)
    got = hits(findings(tmp_path), "finished.leaked")
    assert broken[0] in got


def test_skipped_zero_token_step(tiny_model, tmp_path):
    """The historical leak: the last step, zero tokens and only finished ids, never executed."""
    scenarios.run("aborts", tiny_model, tmp_path)
    steps = open_trace(tmp_path).read("steps").to_pylist()
    last = steps[-1]
    assert last["total_num_scheduled_tokens"] == 0 and last["num_finished"] > 0
    gone = {r["req_id"] for r in open_trace(tmp_path).read("finished").to_pylist()
            if r["step"] == last["step"]}
    edit(tmp_path, "finished", lambda rows: [r for r in rows if r["step"] != last["step"]])
    edit(tmp_path, "steps", lambda rows: rows[:-1] + [dict(rows[-1], num_finished=0)])
    report = findings(tmp_path)
    # the ids were due in a step that now carries nothing: the following step never comes
    leaked = {r for _, r in hits(report, "finished.leaked")}
    assert leaked == set() or leaked <= gone
    edit(tmp_path, "steps", lambda rows: rows + [dict(rows[-1], step=rows[-1]["step"] + 1)])
    leaked = {r for _, r in hits(findings(tmp_path), "finished.leaked")}
    assert gone and gone - {"never-scheduled"} <= leaked


def test_duplicate_new_request(tiny_model, tmp_path):
    import copy

    def duplicate(so, step):
        if so.scheduled_new_reqs and step == 0:
            so.scheduled_new_reqs.append(copy.copy(so.scheduled_new_reqs[0]))
            return step, so.scheduled_new_reqs[0].req_id

    broken = patched(tiny_model, tmp_path, "aborts", duplicate)
    report = findings(tmp_path)
    assert broken[0] in hits(report, "tokens.duplicate_request")
    assert broken[0] in hits(report, "lifecycle.new_while_live")


def test_total_differs_from_sum(tiny_model, tmp_path):
    def bump(so, step):
        if step == 3:
            so.total_num_scheduled_tokens += 1
            return step, None

    patched(tiny_model, tmp_path, "aborts", bump)
    assert hits(findings(tmp_path), "tokens.total_mismatch") == [(3, None)]


def test_listed_without_tokens(tiny_model, tmp_path):
    def forget(so, step):
        ids = cached_ids(so)
        if step == 5 and ids:
            n = so.num_scheduled_tokens.pop(ids[0])
            so.total_num_scheduled_tokens -= n
            return step, ids[0]

    broken = patched(tiny_model, tmp_path, "aborts", forget)
    assert broken[0] in hits(findings(tmp_path), "tokens.listed_without_tokens")


def test_unlisted_request_and_unknown_cached(tiny_model, tmp_path):
    """The scheduler schedules a request but forgets to send it as new: the worker never
    learns it, and its later cached entries are KeyErrors."""
    def hide(so, step):
        if step == 0 and so.scheduled_new_reqs:
            r = so.scheduled_new_reqs.pop()
            return step, r.req_id

    broken = patched(tiny_model, tmp_path, "aborts", hide)
    step, rid = broken[0]
    report = findings(tmp_path)
    assert (step, rid) in hits(report, "tokens.unlisted_request")
    assert (step + 1, rid) in hits(report, "lifecycle.unknown_cached")


def test_finished_while_still_scheduled(tiny_model, tmp_path):
    def free_early(so, step):
        ids = cached_ids(so)
        if step == 4 and ids:
            so.finished_req_ids.add(ids[0])
            return step, ids[0]

    broken = patched(tiny_model, tmp_path, "aborts", free_early)
    step, rid = broken[0]
    report = findings(tmp_path)
    assert (step, rid) in hits(report, "finished.and_scheduled")
    assert (step + 1, rid) in hits(report, "lifecycle.scheduled_after_finish")


def test_finished_id_delivered_twice(tiny_model, tmp_path):
    seen = {}

    def again(so, step):
        for rid in so.finished_req_ids:
            seen.setdefault(rid, step)
        old = [r for r, s in seen.items() if s < step and r not in so.finished_req_ids]
        if old and step >= 0 and not again.done:
            again.done = True
            so.finished_req_ids.add(old[0])
            return step, old[0]

    again.done = False
    broken = patched(tiny_model, tmp_path, "preemption", again)
    assert broken[0] in hits(findings(tmp_path), "finished.duplicate")


def test_too_many_tokens_for_the_request(tiny_model, tmp_path):
    def overshoot(so, step):
        ids = cached_ids(so)
        if step == 8 and ids:
            so.num_scheduled_tokens[ids[0]] += 50
            so.total_num_scheduled_tokens += 50
            return step, ids[0]

    broken = patched(tiny_model, tmp_path, "aborts", overshoot)
    assert broken[0] in hits(findings(tmp_path), "tokens.beyond_request")


def test_computed_tokens_moving_backwards(tiny_model, tmp_path):
    def rewind(so, step):
        cr = so.scheduled_cached_reqs
        if step == 8 and cr.req_ids:
            cr.num_computed_tokens[0] -= 3
            return step, cr.req_ids[0]

    broken = patched(tiny_model, tmp_path, "aborts", rewind)
    assert broken[0] in hits(findings(tmp_path), "computed.progress")


def test_computed_tokens_off_with_batches_in_flight(tiny_model, tmp_path):
    """With two batches in flight a step's rejected drafts come off the count a row late (the
    next row was scheduled before the update); a count off by one there is still found."""
    def skew(so, step):
        cr = so.scheduled_cached_reqs
        if step == 6 and cr.req_ids:
            cr.num_computed_tokens[0] += 1
            return step, cr.req_ids[0]

    broken = patched(tiny_model, tmp_path, "spec_decode", skew, batch_queue=2)
    assert broken[0] in hits(findings(tmp_path), "computed.progress")


def test_spec_tokens_for_unscheduled_and_too_many(tiny_model, tmp_path):
    def bad_drafts(so, step):
        ids = cached_ids(so)
        if step == 7 and ids:
            so.scheduled_spec_decode_tokens["ghost"] = [5, 6]
            so.scheduled_spec_decode_tokens[ids[0]] = [5] * 8
            return step, ids[0]

    broken = patched(tiny_model, tmp_path, "spec_decode", bad_drafts)
    step, rid = broken[0]
    report = findings(tmp_path)
    assert (step, "ghost") in hits(report, "spec.unscheduled")
    assert (step, rid) in hits(report, "spec.too_many")


def test_spec_tokens_before_any_output(tiny_model, tmp_path):
    def early(so, step):
        if so.scheduled_new_reqs and step == 0:
            rid = so.scheduled_new_reqs[0].req_id
            so.scheduled_spec_decode_tokens[rid] = [7]
            return step, rid

    broken = patched(tiny_model, tmp_path, "spec_decode", early)
    assert broken[0] in hits(findings(tmp_path), "spec.before_any_output")


def test_encoder_breaks(tiny_model, tmp_path):
    def bad_encoder(so, step):
        if so.scheduled_new_reqs and step == 0:
            r = so.scheduled_new_reqs[0]
            so.scheduled_encoder_inputs["ghost"] = [0]
            so.free_encoder_mm_hashes.append("never-seen")
            # freed in the very step its request needs it
            so.free_encoder_mm_hashes.append(r.mm_features[0].identifier)
            return step, r.req_id

    broken = patched(tiny_model, tmp_path, "encoder_lookalike", bad_encoder)
    step, rid = broken[0]
    report = findings(tmp_path)
    assert (step, "ghost") in hits(report, "encoder.unscheduled")
    assert (step, None) in hits(report, "encoder.free_unknown")
    assert (step, rid) in hits(report, "encoder.freed_while_needed")


def test_encoder_never_freed(tiny_model, tmp_path):
    def keep(so, step):
        if so.free_encoder_mm_hashes:
            so.free_encoder_mm_hashes.clear()
            return step, None

    patched(tiny_model, tmp_path, "encoder_lookalike", keep)
    assert len(hits(findings(tmp_path), "encoder.never_freed")) == 3


def test_block_out_of_range(tiny_model, tmp_path):
    def far(so, step):
        cr = so.scheduled_cached_reqs
        if step == 6 and cr.req_ids:
            cr.new_block_ids[0] = ([10_000],)
            return step, cr.req_ids[0]

    broken = patched(tiny_model, tmp_path, "aborts", far)
    assert broken[0] in hits(findings(tmp_path), "blocks.out_of_range")


def test_block_handed_out_while_held(tiny_model, tmp_path):
    held = {}

    def steal(so, step):
        for r in so.scheduled_new_reqs:
            if held and not steal.done and so.scheduled_new_reqs:
                victim_block = next(iter(held.values()))
                r.block_ids[0][-1] = victim_block
                steal.done = True
                return step, r.req_id
            held[r.req_id] = r.block_ids[0][-1]

    steal.done = False
    broken = patched(tiny_model, tmp_path, "prefix_cache", steal)
    assert broken[0] in hits(findings(tmp_path), "blocks.double_owner")


# -- breaks by editing a recorded trace -------------------------------------------------------
def test_resumed_without_blocks_and_without_preemption(tiny_model, tmp_path):
    scenarios.run("preemption", tiny_model, tmp_path)
    resumed = [(r["step"], r["req_id"]) for r in open_trace(tmp_path).read("scheduled").to_pylist()
               if r["kind"] == "resumed"]
    assert resumed
    edit(tmp_path, "scheduled", lambda rows: [
        dict(r, new_block_ids=None) if (r["step"], r["req_id"]) == resumed[0] else r
        for r in rows])
    edit(tmp_path, "preempted", lambda rows: [])
    report = findings(tmp_path)
    assert resumed[0] in hits(report, "lifecycle.resumed_without_blocks")
    assert set(resumed) <= set(hits(report, "lifecycle.resumed_without_preemption"))


def test_block_table_too_short(tiny_model, tmp_path):
    scenarios.run("chunked_prefill", tiny_model, tmp_path)
    grown = [(r["step"], r["req_id"]) for r in open_trace(tmp_path).read("scheduled").to_pylist()
             if r["kind"] == "cached" and r["new_block_ids"]]
    assert grown
    edit(tmp_path, "scheduled", lambda rows: [
        dict(r, new_block_ids=None) if (r["step"], r["req_id"]) == grown[0] else r for r in rows])
    assert grown[0] in hits(findings(tmp_path), "blocks.table_short")


def test_block_granted_a_step_late(tiny_model, tmp_path):
    """A plain id (no window needed) whose block comes one step after its tokens crossed into
    it: its table is short for one step though its blocks add up in the end."""
    scenarios.run("chunked_prefill", tiny_model, tmp_path)
    with Gateway(tmp_path) as gw:
        plain = {r["req_id"] for r in gw.sql(
            "SELECT req_id FROM run_groups WHERE plain AND first_kind = 'new'").to_pylist()}
    rows = open_trace(tmp_path).read("scheduled").to_pylist()
    at = {(r["step"], r["req_id"]): r for r in rows if r["kind"]}
    late = next((s, rid) for (s, rid), r in sorted(at.items())
                if rid in plain and r["kind"] == "cached" and r["new_block_ids"]
                and (s + 1, rid) in at and not at[s + 1, rid]["new_block_ids"])
    moved = at[late]["new_block_ids"]
    edit(tmp_path, "scheduled", lambda rs: [
        dict(r, new_block_ids=None) if (r["step"], r["req_id"]) == late
        else dict(r, new_block_ids=moved) if (r["step"], r["req_id"]) == (late[0] + 1, late[1])
        else r for r in rs])
    report = findings(tmp_path)
    assert hits(report, "blocks.table_short") == [late]
    with Gateway(tmp_path) as gw:  # still plain: found without the general walk
        assert gw.sql(f"SELECT plain FROM run_groups WHERE req_id = '{late[1]}'").to_pylist() == [
            {"plain": True}]


def test_model_output_ids_mismatch(tiny_model, tmp_path):
    scenarios.run("aborts", tiny_model, tmp_path)
    outputs = open_trace(tmp_path).read("model_outputs").to_pylist()
    row, later = outputs[5], outputs[-3]
    assert later["step"] > row["step"] + 1
    # one id missing; in a later step one id renamed, so the step's count still matches and
    # only the ids tell (the check compares fingerprints first)
    edit(tmp_path, "model_outputs", lambda rows: [
        dict(r, req_id="ghost") if (r["step"], r["req_id"]) == (later["step"], later["req_id"])
        else r for r in rows
        if (r["step"], r["req_id"]) != (row["step"], row["req_id"])])
    found = hits(findings(tmp_path), "outputs.ids_mismatch")
    assert sorted(found) == sorted([(row["step"], row["req_id"]), (later["step"], "ghost"),
                                    (later["step"], later["req_id"])])


def test_abandoned_request(tiny_model, tmp_path):
    scenarios.run("aborts", tiny_model, tmp_path)
    edit(tmp_path, "finish_events", lambda rows: [r for r in rows if r["req_id"] != "a0"])
    edit(tmp_path, "finished", lambda rows: [r for r in rows if r["req_id"] != "a0"])
    assert [r for _, r in hits(findings(tmp_path), "lifecycle.abandoned")] == ["a0"]


def test_budgets_and_model_len_from_the_manifest(tiny_model, tmp_path):
    scenarios.run("aborts", tiny_model, tmp_path)
    edit_manifest(tmp_path, max_num_batched_tokens=32, max_num_seqs=2, max_model_len=45)
    report = findings(tmp_path)
    for inv in ("budget.tokens", "budget.seqs", "tokens.beyond_model_len"):
        assert hits(report, inv), inv


def test_starved_and_stalled(tiny_model, tmp_path):
    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness

    h = Harness(tiny_model)
    with attach(h.scheduler, tmp_path):
        h.add("long", scenarios.prompt(1, 8), max_tokens=150)
        h.add("other", scenarios.prompt(2, 8), max_tokens=150)
        h.run()
    rid, lo = "long", 20
    edit(tmp_path, "scheduled", lambda rs: [r for r in rs if not (
        r["req_id"] == rid and lo <= r["step"] < lo + 66)])
    edit(tmp_path, "steps", lambda rs: [
        dict(r, total_num_scheduled_tokens=0, num_waiting=2, num_running=0)
        if 100 <= r["step"] < 110 else r for r in rs])
    edit_manifest(tmp_path, max_num_batched_tokens=10_000)
    report = findings(tmp_path)
    assert [r for _, r in hits(report, "progress.starved")] == [rid]
    assert hits(report, "progress.stalled") == [(107, None)]


def test_trace_integrity(tiny_model, tmp_path):
    scenarios.run("aborts", tiny_model, tmp_path)
    edit(tmp_path, "steps", lambda rows: [r for r in rows if not 3 <= r["step"] <= 5])
    edit_manifest(tmp_path, closed_cleanly=False, dropped_steps=[[10, 12]],
                  attached_mid_stream=True)
    report = findings(tmp_path)
    assert hits(report, "trace.missing_steps") == [(3, None)]
    assert hits(report, "trace.dropped_steps") == [(10, None)]
    assert len(hits(report, "trace.unclean_close")) == 1
    assert len(hits(report, "trace.attached_mid_stream")) == 1


def test_attached_mid_stream_does_not_blame_the_scheduler(tiny_model, tmp_path):
    scenarios.run("aborts", tiny_model, tmp_path)
    # As if recording began after a0's introduction: the trace never saw it.
    edit(tmp_path, "requests", lambda rows: [r for r in rows if r["req_id"] != "a0"])
    edit(tmp_path, "scheduled", lambda rows: [
        r for r in rows if not (r["req_id"] == "a0" and r["kind"] == "new")])
    assert hits(findings(tmp_path), "lifecycle.unknown_cached")
    edit_manifest(tmp_path, attached_mid_stream=True)
    assert not hits(findings(tmp_path), "lifecycle.unknown_cached")


# -- the CLI ----------------------------------------------------------------------------------
def test_cli_formats_and_exit_codes(tiny_model, tmp_path):
    trace = tmp_path / "t"
    scenarios.run("chunked_prefill", tiny_model, trace)
    r = CliRunner().invoke(app, ["check", str(trace), "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == []

    def drop_finished(so, step):
        if so.finished_req_ids:
            so.finished_req_ids.clear()
            return step, None

    broken = tmp_path / "b"
    patched(tiny_model, broken, "chunked_prefill", drop_finished)
    r = CliRunner().invoke(app, ["check", str(broken), "--format", "json"])
    assert r.exit_code == 1
    rows = json.loads(r.stdout)
    assert rows and {"invariant", "severity", "step", "req_id", "message"} <= set(rows[0])
    assert "finished.leaked" in {x["invariant"] for x in rows}
    r = CliRunner().invoke(app, ["check", str(broken), "--format", "jsonl"])
    assert [json.loads(line) for line in r.stdout.splitlines()] == rows
    r = CliRunner().invoke(app, ["check", str(broken), "--format", "csv"])
    assert r.stdout.splitlines()[0] == "invariant,severity,engine,step,req_id,message"
    r = CliRunner().invoke(app, ["check", str(broken), "--format", "junit"])
    import xml.etree.ElementTree as ET

    suite = ET.fromstring(r.stdout)
    assert int(suite.get("failures")) >= 1
    r = CliRunner().invoke(app, ["check", str(broken)])
    assert r.exit_code == 1 and "finished.leaked" in r.stdout
    # --only and --fail-on
    r = CliRunner().invoke(app, ["check", str(broken), "--only", "tokens.nonpositive"])
    assert r.exit_code == 0
    r = CliRunner().invoke(app, ["check", str(trace), "--fail-on", "info",
                                 "--only", "trace.unclean_close"])
    assert r.exit_code == 0


def test_cli_bad_input(tiny_model, tmp_path):
    trace = tmp_path / "t"
    scenarios.run("chunked_prefill", tiny_model, trace)
    runner = CliRunner()

    def fails(args, text):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr + r.stdout
        assert text in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

    fails(["check", str(trace), "--only", "no.such"], "unknown check id")
    bad = tmp_path / "checks"
    bad.mkdir()
    (bad / "x.sql").write_text("-- id: mine.bad\n-- severity: fatal\nSELECT 1\n")
    fails(["check", str(trace), "--invariants", str(bad)], "malformed check")
    (bad / "x.sql").write_text("-- id: mine.bad\n-- severity: error\n-- title: t\n-- why: w\n"
                               "-- relies_on: r\n-- needs: steps\nSELECT nonsense FROM steps\n")
    fails(["check", str(trace), "--invariants", str(bad)], "mine.bad")
    fails(["check", str(tmp_path / "missing")], "no such trace")
    fails(["sql", str(trace), "SELECT * FROM no_such_view"], "SQL error")
    runner.env = {"VLLM_CONTRACT_MEMORY_LIMIT": "lots"}
    fails(["check", str(trace)], "VLLM_CONTRACT_MEMORY_LIMIT")


def test_memory_limit_is_bounded_and_spills_are_cleaned_up(tiny_model, tmp_path, monkeypatch):
    """DuckDB gets a budget (not its default 80 % of the machine) and a private spill
    directory, removed when the gateway closes."""
    trace = tmp_path / "t"
    scenarios.run("chunked_prefill", tiny_model, trace)
    monkeypatch.delenv("VLLM_CONTRACT_MEMORY_LIMIT", raising=False)
    with Gateway(trace) as gw:
        limit = gw.sql("SELECT current_setting('memory_limit') AS m")["m"][0].as_py()
        spill = Path(gw.sql("SELECT current_setting('temp_directory') AS t")["t"][0].as_py())
        assert spill.is_dir()
    assert not spill.exists()
    number, unit = limit.split()
    assert unit in ("MiB", "GiB") and float(number) * (1024 if unit == "GiB" else 1) <= 6 * 1024
    monkeypatch.setenv("VLLM_CONTRACT_MEMORY_LIMIT", "300MB")
    with Gateway(trace) as gw:
        assert gw.sql("SELECT current_setting('memory_limit') AS m")["m"][0].as_py() == "286.1 MiB"


def test_user_check_and_a_trace_lacking_a_table(tiny_model, tmp_path):
    trace = tmp_path / "t"
    scenarios.run("aborts", tiny_model, trace)
    mine = tmp_path / "checks"
    mine.mkdir()
    (mine / "long.sql").write_text(
        "-- id: mine.long_prompt\n-- severity: warning\n-- title: long prompt\n"
        "-- why: ours\n-- relies_on: nothing\n-- needs: requests\n"
        "SELECT engine, step, req_id, 'prompt ' || CAST(prompt_len AS VARCHAR) AS details\n"
        "FROM requests WHERE prompt_len >= 40\n")
    r = CliRunner().invoke(app, ["check", str(trace), "--invariants", str(mine), "--format",
                                 "json", "--only", "mine.long_prompt"])
    assert r.exit_code == 0
    assert {x["req_id"] for x in json.loads(r.stdout)} == {"a0", "a1", "a2", "a3"}
    (e,) = open_trace(trace).engines
    import shutil

    shutil.rmtree(e.dir / "finish_events")
    report = findings(trace)
    assert "finished.leaked" in report.skipped
    assert "finish_events" in report.skipped["finished.leaked"]


def test_sql_command_and_views(tiny_model, tmp_path):
    scenarios.run("preemption", tiny_model, tmp_path)
    r = CliRunner().invoke(app, ["sql", str(tmp_path), "SELECT COUNT(*) AS n FROM preempted",
                                 "--format", "json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)[0]["n"] == open_trace(tmp_path).read("preempted").num_rows
    with Gateway(tmp_path) as gw:
        life = gw.sql("SELECT * FROM lifeline").to_pylist()
        assert {x["req_id"] for x in life} == {f"p{i}" for i in range(6)}
        assert all(x["finish_reason"] == "LENGTH" for x in life)
        assert sum(x["resumes"] for x in life) == gw.sql(
            "SELECT COUNT(*) AS n FROM scheduled WHERE kind = 'resumed'")["n"][0].as_py()
    # engine is an ENUM in the views; to a user's SQL and its output it is the engine's name
    (name,) = [e.name for e in open_trace(tmp_path).engines]
    rows = open_trace(tmp_path).read("scheduled").num_rows
    query = (f"SELECT engine, COUNT(*) AS n, MAX(engine || '/') AS tagged FROM scheduled "
             f"WHERE engine = '{name}' AND engine LIKE '%dp0' AND engine IN "
             f"(SELECT col0 FROM (VALUES ('{name}'))) GROUP BY engine")
    for fmt in ("json", "csv"):
        r = CliRunner().invoke(app, ["sql", str(tmp_path), query, "--format", fmt])
        assert r.exit_code == 0, r.output
        if fmt == "json":
            assert json.loads(r.stdout) == [{"engine": name, "n": rows, "tagged": name + "/"}]
        else:
            assert r.stdout.splitlines() == ["engine,n,tagged", f"{name},{rows},{name}/"]


# -- portability ------------------------------------------------------------------------------
def test_catalog_transpiles_to_spark():
    import sqlglot
    from sqlglot.errors import ErrorLevel

    from vllm_contract.replay.views import derived_sql

    sources = [(inv.path.name, inv.sql) for inv in catalog.load()]
    sources += [(f"derived view {i}", sql)
                for i, sql in enumerate(derived_sql(["engine=a-dp0", "engine=o'b-dp1"]))]
    for name, sql in sources:
        try:
            out = sqlglot.transpile(sql, read="duckdb", write="spark",
                                    unsupported_level=ErrorLevel.RAISE)
        except Exception as e:  # noqa: BLE001 - any failure names its source
            pytest.fail(f"{name}: {e}")
        assert out and out[0].strip()


def test_catalog_docs_are_generated():
    root = Path(__file__).resolve().parents[1]
    assert (root / "docs" / "invariants.md").read_text() == catalog.markdown(catalog.load()), (
        "docs/invariants.md is stale: run `make docs`")


def test_step_never_executed(tiny_model, tmp_path):
    """A live engine's trace records each hand-off to the executor; a step with finished ids
    that was never executed leaks them even though finished_req_ids carried them."""
    scenarios.run("aborts", tiny_model, tmp_path)
    steps = open_trace(tmp_path).read("steps").to_pylist()
    skipped = next(s["step"] for s in steps[:-1] if s["num_finished"] > 0)
    gone = {r["req_id"] for r in open_trace(tmp_path).read("finished").to_pylist()
            if r["step"] == skipped}
    edit(tmp_path, "transport", lambda rows: [
        {"step": s["step"], "event": "executed", "worker": None, "seq": i + 1, "t_ns": 0,
         "num_scheduled_tokens": s["total_num_scheduled_tokens"]}
        for i, s in enumerate(steps) if s["step"] != skipped])
    report = findings(tmp_path)
    assert hits(report, "transport.not_executed") == [(skipped, None)]
    assert gone <= {r for _, r in hits(report, "finished.leaked")}
    # receipts: the worker got every hand-off but one
    edit(tmp_path, "transport", lambda rows: rows + [
        dict(r, event="received", worker=0) for r in rows if r["seq"] != 3])
    lost = next(r["step"] for r in open_trace(tmp_path).read("transport").to_pylist()
                if r["seq"] == 3)
    assert hits(findings(tmp_path), "transport.not_received") == [(lost, None)]


def test_info_reports_view_counts(tiny_model, tmp_path):
    scenarios.run("preemption", tiny_model, tmp_path)
    r = CliRunner().invoke(app, ["info", str(tmp_path), "--format", "json"])
    assert r.exit_code == 0
    views = json.loads(r.stdout)["views"]
    t = open_trace(tmp_path)
    for table in schema.TABLE_NAMES:
        assert views[table] == t.read(table).num_rows, table
    assert views["lifeline"] == views["instances"] == 6 and views["engines"] == 1


def test_sql_interactive_prompt(tiny_model, tmp_path):
    scenarios.run("aborts", tiny_model, tmp_path)
    session = ("SELECT COUNT(*) AS n\n  FROM finished;\n.views\nSELECT nope;\n"
               "SELECT req_id FROM lifeline WHERE req_id = 'a1';\n")
    r = CliRunner().invoke(app, ["sql", str(tmp_path)], input=session)
    assert r.exit_code == 0, r.stderr
    n = open_trace(tmp_path).read("finished").num_rows
    assert f"\n{n} " in r.stdout or f"\n{n}\n" in r.stdout
    assert "lifeline" in r.stdout  # .views listed them
    assert "SQL error" in r.stderr  # a bad statement does not end the session
    assert "a1" in r.stdout


def test_shared_views_are_computed_once_and_shown_in_the_progress(tiny_model, tmp_path):
    """The shared views are computed once, before the first check that reads them, and the
    progress line says so (at a million steps that takes most of a run); `runs` stays a view
    over them; the checks that read them give the same findings as when each is run alone."""
    scenarios.run("preemption", tiny_model, tmp_path)
    edit(tmp_path, "preempted", lambda rows: [])  # findings for checks that read runs
    calls = []
    with Gateway(tmp_path) as gw:
        invs = catalog.load()
        report = checker.run(gw, invs, progress=lambda n, total, name: calls.append((n, name)))
        assert gw.is_materialized("windowed_runs") and gw.is_materialized("run_ids")
        assert not gw.is_materialized("runs")
    shared = [(n, name.split()[-1].rstrip(")")) for n, name in calls
              if "computing the shared view" in name]
    # each view, and the views that read it: computed once, before the first check needing any
    readers_of = {"step_totals": {"step_totals"}, "grants": {"grants"},
                  "drafts": {"drafts", "run_groups", "windowed_runs", "run_ids", "runs"},
                  "instances": {"instances", "run_groups", "windowed_runs", "run_ids", "runs"},
                  "run_groups": {"run_groups", "windowed_runs", "run_ids", "runs"},
                  "windowed_runs": {"windowed_runs", "run_ids", "runs"},
                  "run_ids": {"run_ids"}}
    assert sorted(name for _, name in shared) == sorted(readers_of)
    for n, name in shared:
        assert n == min(i for i, inv in enumerate(invs) if readers_of[name] & set(inv.needs))
    reads = set(readers_of) | {"runs"}
    assert calls[-1] == (len(invs), "")
    readers = [inv.id for inv in invs if reads & set(inv.needs)]
    assert "computed.progress" in readers and "blocks.table_short" in readers
    alone = [f for rid in readers for f in findings(tmp_path, [rid]).findings]
    assert any(f.invariant == "lifecycle.resumed_without_preemption" for f in alone)
    assert sorted(map(str, alone)) == sorted(
        str(f) for f in report.findings if f.invariant in readers)


# The `runs` view as a plain window over every listed row (what it was before ids that need no
# window were split off): the reference the split must equal, row for row.
WINDOW_RUNS = """
WITH keyed AS (
    SELECT s.step, s.kind, s.num_scheduled_tokens, s.num_computed_tokens, s.num_output_tokens,
           COALESCE(CARDINALITY(s.spec_token_ids), 0) AS drafts, i.inst, s.engine, s.req_id
    FROM scheduled s
    LEFT JOIN instances i ON i.engine = s.engine AND i.req_id = s.req_id
         AND s.step >= i.intro_step AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
    WHERE s.kind IS NOT NULL
)
SELECT engine, req_id, inst, step, kind, num_scheduled_tokens, num_computed_tokens,
       num_output_tokens, drafts,
       LAG(step) OVER w AS prev_step,
       LAG(num_computed_tokens + num_scheduled_tokens) OVER w AS prev_end,
       LAG(drafts) OVER w AS prev_drafts
FROM keyed
WINDOW w AS (PARTITION BY engine, req_id, inst ORDER BY step)
"""


def runs_rows(path):
    """(reference rows, the view's rows, ids the view took without its window, all ids)."""
    with Gateway(path) as gw:
        want = gw.sql(WINDOW_RUNS).to_pylist()
        got = gw.sql("""
            SELECT k.engine, k.req_id, r.inst, r.step, r.kind, r.num_scheduled_tokens,
                   r.num_computed_tokens, r.num_output_tokens, r.drafts, r.prev_step,
                   r.prev_end, r.prev_drafts
            FROM runs r JOIN run_ids k ON k.inst = r.inst""").to_pylist()
        plain = gw.sql("SELECT COUNT(*) AS n FROM run_groups WHERE plain")["n"][0].as_py()
        ids = gw.sql("SELECT COUNT(*) AS n FROM (SELECT DISTINCT engine, req_id FROM scheduled "
                     "WHERE kind IS NOT NULL)")["n"][0].as_py()
        assert gw.sql("SELECT COUNT(*) AS n FROM run_groups")["n"][0].as_py() == ids
    for r in want:  # orphans: the reference leaves them unkeyed, the view hashes their name
        r.pop("inst")
    for r in got:
        r.pop("inst")
    key = lambda r: tuple((v is None, v) for v in r.values())  # noqa: E731
    return sorted(want, key=key), sorted(got, key=key), plain, ids


@pytest.mark.parametrize("name", ["preemption", "id_reuse", "spec_decode", "chunked_prefill",
                                  "aborts"])
def test_runs_equal_a_plain_window(name, tiny_model, tmp_path):
    """Plain ids (run_groups), whose rows need no window, and the rest (through the window) together
    give what one window over every row gives."""
    scenarios.run(name, tiny_model, tmp_path)
    want, got, plain, ids = runs_rows(tmp_path)
    assert got == want
    assert len(want) > ids > 0
    if name != "spec_decode":  # with drafts every id takes the window
        assert 0 < plain, f"{name}: no id took the short way"


def test_runs_take_the_window_for_ids_broken_mid_run(tiny_model, tmp_path):
    """Three breaks inside one id's run of steps that its first and last rows cannot show: a row
    listed twice in one step, a step skipped, a count off by one. Each id then goes through the
    window (its sums of hashes differ), and runs still equals the reference."""
    scenarios.run("aborts", tiny_model, tmp_path)
    rows = open_trace(tmp_path).read("scheduled").to_pylist()
    by_id = {}
    for r in rows:
        if r["kind"]:
            by_id.setdefault(r["req_id"], []).append(r)
    long_ = sorted((rs for rs in by_id.values() if len(rs) >= 6), key=lambda rs: rs[0]["req_id"])
    assert len(long_) >= 3, "the scenario should have three ids listed in six steps or more"
    dup, gap, off = (rs[3] for rs in long_[:3])

    def breaks(rows):
        out = []
        for r in rows:
            if r is gap or (r["step"], r["req_id"]) == (gap["step"], gap["req_id"]):
                continue
            if (r["step"], r["req_id"]) == (off["step"], off["req_id"]):
                r = {**r, "num_computed_tokens": r["num_computed_tokens"] + 1}
            out.append(r)
            if (r["step"], r["req_id"]) == (dup["step"], dup["req_id"]):
                out.append(dict(r))
        return out

    with Gateway(tmp_path) as gw:
        plain_before = gw.sql("SELECT COUNT(*) AS n FROM run_groups WHERE plain")["n"][0].as_py()
    edit(tmp_path, "scheduled", breaks)
    want, got, plain, _ = runs_rows(tmp_path)
    assert got == want
    assert plain == plain_before - 3
    report = findings(tmp_path)
    assert (dup["step"], dup["req_id"]) in hits(report, "tokens.duplicate_request")
    assert (off["step"], off["req_id"]) in hits(report, "computed.progress")


# Checks that read a plain id's rows only when its run_groups row shows a break, or read
# `grants` and `step_totals` instead of every row: each as the row-by-row query it replaced.
ROW_BY_ROW = {
    "tokens.beyond_request": """
        SELECT k.engine, r.step, k.req_id FROM runs r JOIN run_ids k ON k.inst = r.inst
        WHERE r.inst > 0 AND r.num_scheduled_tokens IS NOT NULL
          AND r.num_computed_tokens + r.num_scheduled_tokens
              > k.prompt_len + COALESCE(r.num_output_tokens, 0) + r.drafts""",
    "finished.and_scheduled": """
        SELECT s.engine, s.step, s.req_id FROM scheduled s
        JOIN finished f ON f.engine = s.engine AND f.step = s.step AND f.req_id = s.req_id
        WHERE s.kind IN ('cached', 'resumed')""",
    "lifecycle.scheduled_after_finish": """
        SELECT s.engine, s.step, s.req_id FROM scheduled s
        JOIN instances i ON i.engine = s.engine AND i.req_id = s.req_id
             AND s.step >= i.intro_step
             AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
        WHERE s.kind IN ('cached', 'resumed') AND i.freed_step < s.step""",
    "tokens.beyond_model_len": """
        SELECT s.engine, s.step, s.req_id FROM scheduled s JOIN engines e ON e.engine = s.engine
        WHERE s.num_computed_tokens + s.num_scheduled_tokens > e.max_model_len""",
    "blocks.out_of_range": """
        SELECT DISTINCT engine, step, req_id FROM (
            SELECT engine, step, req_id, UNNEST(b) AS block_id FROM (
                SELECT engine, step, req_id, UNNEST(new_block_ids) AS b FROM scheduled)) i
        WHERE block_id >= (SELECT MIN(num_kv_blocks) FROM engines)""",
    "blocks.table_short": """
        WITH walked AS (
            SELECT inst, step, num_computed_tokens + num_scheduled_tokens AS tokens, blocks,
                   SUM(CASE WHEN kind IN ('new', 'resumed') THEN 1 ELSE 0 END) OVER w AS segment,
                   SUM(blocks) OVER w AS so_far,
                   MAX(CASE WHEN blocks > 0 OR kind IN ('new', 'resumed') THEN step END)
                       OVER w AS changed_at
            FROM runs WINDOW w AS (PARTITION BY inst ORDER BY step ROWS UNBOUNDED PRECEDING)
        ),
        based AS (
            SELECT *, MIN(so_far - blocks) OVER (PARTITION BY inst, segment) AS base
            FROM walked WHERE segment > 0
        )
        SELECT k.engine, MIN(b.step) AS step, k.req_id FROM based b
        JOIN run_ids k ON k.inst = b.inst JOIN engines e ON e.engine = k.engine
        WHERE (b.so_far - b.base) * e.block_size < b.tokens
        GROUP BY k.engine, k.req_id, b.inst, b.changed_at""",
    "outputs.ids_mismatch": """
        WITH updated AS (SELECT DISTINCT engine, step FROM updates),
        s AS (SELECT x.engine, x.step, x.req_id FROM scheduled x
              JOIN updated u ON u.engine = x.engine AND u.step = x.step
              WHERE x.num_scheduled_tokens IS NOT NULL),
        m AS (SELECT x.engine, x.step, x.req_id FROM model_outputs x
              JOIN updated u ON u.engine = x.engine AND u.step = x.step)
        SELECT COALESCE(s.engine, m.engine) AS engine, COALESCE(s.step, m.step) AS step,
               COALESCE(s.req_id, m.req_id) AS req_id
        FROM s FULL OUTER JOIN m ON m.engine = s.engine AND m.step = s.step
             AND m.req_id = s.req_id
        WHERE s.req_id IS NULL OR m.req_id IS NULL""",
    "tokens.total_mismatch": """
        SELECT t.engine, t.step, NULL AS req_id FROM steps t
        LEFT JOIN (SELECT engine, step, SUM(num_scheduled_tokens) AS n FROM scheduled
                   GROUP BY engine, step) s ON s.engine = t.engine AND s.step = t.step
        WHERE t.total_num_scheduled_tokens <> COALESCE(s.n, 0)""",
}


def test_split_checks_equal_their_row_by_row_form(tiny_model, tmp_path):
    """Breaks in plain ids and in ids that take the window alike (a preempted one does):
    each check that spares itself plain ids' rows, or reads the shared `grants` or
    `step_totals`, reports exactly what the row-by-row query reports, and both kinds of id are
    among its findings where it has a split."""
    scenarios.run("mixed", tiny_model, tmp_path)
    with Gateway(tmp_path) as gw:
        plain = {r["req_id"] for r in gw.sql("SELECT req_id FROM run_groups WHERE plain")
                 .to_pylist()}
        blocks = gw.sql("SELECT num_kv_blocks FROM engines")["num_kv_blocks"][0].as_py()
    rows = open_trace(tmp_path).read("scheduled").to_pylist()
    ids = sorted({r["req_id"] for r in rows if r["kind"]})
    windowed = [i for i in ids if i not in plain]
    assert len(plain) >= 4 and windowed, (plain, windowed)
    plain_ids = sorted(plain)
    short = set(plain_ids[:2] + windowed[:1])  # prompts said shorter than they are
    listed = {}
    for r in rows:
        if r["kind"] == "cached":
            listed.setdefault(r["req_id"], []).append(r["step"])
    # finished at one of their own cached steps (and so scheduled after it too)
    freed = [(listed[i][len(listed[i]) // 2], i) for i in plain_ids[2:4] + windowed[:1]
             if len(listed.get(i, ())) >= 3]
    assert len(freed) == 3, "the scenario should list three ids as cached three times or more"

    unfed = {plain_ids[-1], windowed[0]}

    def far_blocks(rows):
        seen = set()
        for r in rows:
            if r["new_block_ids"] and any(r["new_block_ids"]) and r["req_id"] not in seen:
                seen.add(r["req_id"])
                if len(seen) % 3 == 0:
                    r["new_block_ids"] = [[b + blocks for b in g] for g in r["new_block_ids"]]
            elif r["new_block_ids"] and any(r["new_block_ids"]) and r["req_id"] in unfed:
                unfed.discard(r["req_id"])
                r["new_block_ids"] = None  # its table left short from here
        return rows

    edit(tmp_path, "scheduled", far_blocks)
    edit(tmp_path, "requests", lambda rs: [
        {**r, "prompt_len": r["prompt_len"] - 3} if r["req_id"] in short else r for r in rs])
    edit(tmp_path, "finished", lambda rs: rs + [
        {**rs[0], "step": step, "req_id": rid} for step, rid in freed])
    lengths = [r["num_computed_tokens"] + r["num_scheduled_tokens"] for r in rows
               if r["num_scheduled_tokens"]]
    edit_manifest(tmp_path, max_model_len=sorted(lengths)[len(lengths) * 3 // 4])
    edit(tmp_path, "model_outputs", lambda rs: [  # one output lost, one for nobody
        r for r in rs if (r["step"], r["req_id"]) != (rs[5]["step"], rs[5]["req_id"])]
        + [{**rs[-7], "req_id": "ghost"}])
    edit(tmp_path, "steps", lambda rs: [  # totals off by one
        {**r, "total_num_scheduled_tokens": r["total_num_scheduled_tokens"] + 1}
        if r["step"] % 7 == 3 else r for r in rs])
    report = findings(tmp_path, list(ROW_BY_ROW))
    with Gateway(tmp_path) as gw:
        assert plain == {r["req_id"] for r in gw.sql(
            "SELECT req_id FROM run_groups WHERE plain").to_pylist()}, "the breaks keep ids plain"
        for inv, query in ROW_BY_ROW.items():
            want = sorted((r["step"], r["req_id"]) for r in gw.sql(query).to_pylist())
            got = sorted(hits(report, inv))
            assert got == want, inv
            assert want, f"{inv}: the breaks should give it findings"
            if inv in ("tokens.beyond_request", "finished.and_scheduled",
                       "lifecycle.scheduled_after_finish", "blocks.table_short"):
                names = {rid for _, rid in got}
                assert names & plain and names - plain, f"{inv}: plain and windowed ids both"
