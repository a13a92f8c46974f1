"""Each invariant found when a clean recorded trace is edited: breaks that would derail the
scheduler itself, or that concern the recorder."""

from __future__ import annotations

from __future__ import annotations



from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios

from checking import (edit, edit_manifest, findings, hits)


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
