"""Diff tests of computed.progress: num_computed_tokens must advance by what the previous row
scheduled, less the draft tokens the model rejected, and may restart only across a preemption.
"""

from __future__ import annotations

import tinytrace as tt
from tinytrace import cached, intro, new, resumed


def sampled(step, rid, *tokens):
    return {"step": step, "req_id": rid, "pos": 0, "sampled_token_ids": list(tokens)}


def write(tmp_path, scheduled, **tables):
    """The trace with a steps row, and an update, for every step up to the last listed one;
    each step's total is the sum of its rows' tokens."""
    n = max(r["step"] for r in scheduled) + 1

    def total(i):
        return sum(r["num_scheduled_tokens"] for r in scheduled if r["step"] == i)
    return tt.write(tmp_path, {"steps": tt.steps(n, total_num_scheduled_tokens=total),
                               "updates": tt.steps(n), "scheduled": scheduled, **tables})


def _decode(tmp_path, computed_at_2):
    # an 8-token prompt in blocks 0 and 1, then one token a step (the 9th opens block 2)
    write(tmp_path,
          [new(0, "a", 0, 8, [0, 1]), cached(1, "a", 8, 1, [2]), cached(2, "a", computed_at_2, 1)],
          requests=[intro(0, "a", 8)],
          model_outputs=[sampled(0, "a", 11), sampled(1, "a", 12), sampled(2, "a", 13)])


def test_progress_count_skips_a_token(tmp_path):
    """Without a preemption the count jumps from 9 to 10: the worker would write KV from
    position 10 on and leave position 9 unwritten."""
    _decode(tmp_path, computed_at_2=10)
    assert tt.found(tmp_path, "computed.progress") == [
        (2, "a", "num_computed_tokens 10, expected 9 from step 1")]


def test_progress_count_advances_by_what_was_scheduled(tmp_path):
    """Near miss: step 1 scheduled one token at 8, so step 2 starts at 9."""
    _decode(tmp_path, computed_at_2=9)
    assert tt.found(tmp_path, "computed.progress") == []


def _speculate(tmp_path, computed_at_2):
    # step 1 schedules one token and two drafts (3 tokens at 8); the model samples 2 tokens,
    # so it accepted one draft and rejected the other, which step 2's count must leave out
    write(tmp_path,
          [new(0, "a", 0, 8, [0, 1]), cached(1, "a", 8, 3, [2], spec_token_ids=[21, 22]),
           cached(2, "a", computed_at_2, 1)],
          requests=[intro(0, "a", 8)],
          model_outputs=[sampled(0, "a", 11), sampled(1, "a", 21, 23), sampled(2, "a", 24)])


def test_progress_rejected_draft_still_counted(tmp_path):
    """The count after a step with drafts includes a draft the model rejected: 8 + 3 = 11
    instead of 8 + 3 - 1 = 10, so the rejected token's stale KV is taken as computed."""
    _speculate(tmp_path, computed_at_2=11)
    assert tt.found(tmp_path, "computed.progress") == [
        (2, "a", "num_computed_tokens 11, expected 10 from step 1")]


def test_progress_rejected_draft_taken_off(tmp_path):
    """Near miss: the rejected draft comes off the count sent with the next row (10)."""
    _speculate(tmp_path, computed_at_2=10)
    assert tt.found(tmp_path, "computed.progress") == []


def test_progress_restarts_after_preemption(tmp_path):
    """A request preempted in step 2 loses its KV; resumed in step 3 with a 4-token prefix hit
    its count restarts at 4 (not 9), and grows from there."""
    write(tmp_path,
          [new(0, "a", 0, 8, [0, 1]), cached(1, "a", 8, 1, [2]),
           resumed(3, "a", 4, 5, [0, 3, 4]), cached(4, "a", 9, 1)],
          requests=[intro(0, "a", 8)], preempted=[{"step": 2, "req_id": "a"}],
          model_outputs=[sampled(0, "a", 11), sampled(1, "a", 12), sampled(3, "a", 12),
                         sampled(4, "a", 13)])
    assert tt.found(tmp_path, "computed.progress") == []
