"""Each invariant found at the right step and request when the real scheduler's output is
broken right after schedule() returns, as a scheduler bug would break it."""

from __future__ import annotations

from __future__ import annotations



from vllm_contract.trace import open_trace
from vllm_contract.rig import breaks, scenarios

from checking import (cached_ids, edit, findings, hits, patched)


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


def test_encoder_output_freed_between_chunks(tiny_model, tmp_path):
    """LOOK-ALIKE encoder inputs: an image across a prefill's chunk boundary, freed with the
    second chunk. That chunk does not schedule the encoder input, yet reads its output."""
    broken = patched(tiny_model, tmp_path, "encoder_lookalike",
                     breaks.free_encoder_between_chunks())
    assert hits(findings(tmp_path), "encoder.freed_while_needed") == broken


def test_preempted_request_back_without_resumed(tiny_model, tmp_path):
    """A resumed request left out of resumed_req_ids: its whole new table would be appended
    to the stale one."""
    broken = patched(tiny_model, tmp_path, "preemption", breaks.resume_as_cached())
    assert hits(findings(tmp_path), "lifecycle.preempted_not_resumed") == broken


def test_lost_step_leaves_running_requests_stuck(tiny_model, tmp_path):
    """A counted decode step that never reaches the worker: the real scheduler waits for its
    tokens, scheduling nothing for 40 steps while its requests run; reported at the 32nd."""
    broken = patched(tiny_model, tmp_path, "aborts", breaks.lose_a_step(stall=40))
    (lost, _), = broken
    report = findings(tmp_path)
    assert hits(report, "progress.stuck_running") == [(lost + 31, None)]
    (f,) = [f for f in report.findings if f.invariant == "progress.stuck_running"]
    assert f"40 consecutive zero-token steps from step {lost} " in f.message
    assert hits(report, "progress.stalled") == []
