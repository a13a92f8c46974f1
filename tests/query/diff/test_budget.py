"""Diff tests of the budget checks (budget.*): steps that schedule more requests or tokens than
the engine's settings allow, and the same steps just within them.

The look-alike engine allows 4 requests and 32 tokens a step (tinytrace.SETTINGS)."""

from __future__ import annotations

import tinytrace as tt
from tinytrace import cached, intro, new


def write(tmp_path, n_steps, scheduled, **tables):
    """The trace with steps 0..n_steps-1, each step's total the sum of its rows' tokens."""
    def total(i):
        return sum(r["num_scheduled_tokens"] for r in scheduled if r["step"] == i)
    steps = tt.steps(n_steps, total_num_scheduled_tokens=total)
    return tt.write(tmp_path, {"steps": steps, "scheduled": scheduled, **tables})


# --- budget.seqs --------------------------------------------------------------------------------

def _fifth_request(tmp_path, e_step):
    # a, b, c, d fill the 4 slots from step 0 (2-token prompts, then decoding); a finishes in
    # step 1's update; e (one block, id 4) is admitted at e_step
    ids = "abcd"
    rows = [new(0, r, 0, 2, [i], pos=i) for i, r in enumerate(ids)]
    rows += [cached(1, r, 2, 1, pos=i) for i, r in enumerate(ids)]
    rows += [cached(2, r, 3, 1, pos=i) for i, r in enumerate(ids[1:])]
    rows.append(new(e_step, "e", 0, 2, [4]))
    if e_step < 2:
        rows.append(cached(2, "e", 2, 1, pos=3))
    write(tmp_path, 3, rows,
          requests=[intro(0, r, 2, pos=i) for i, r in enumerate(ids)] + [intro(e_step, "e", 2)],
          finish_events=[{"step": 1, "req_id": "a", "reason": "LENGTH",
                          "source": "update_from_output", "t_ns": 1500}],
          finished=[{"step": 2, "req_id": "a"}])


def test_seqs_fifth_request_while_four_run(tmp_path):
    """A fifth request is admitted while four still run: the persistent batch has 4 slots.
    The steps with exactly 4 requests are not reported."""
    _fifth_request(tmp_path, e_step=1)
    assert tt.found(tmp_path, "budget.seqs") == [(1, None, "5 requests > max_num_seqs 4")]


def test_seqs_fifth_request_after_one_finished(tmp_path):
    """Near miss: the fifth request takes the slot of one that finished in the step before."""
    _fifth_request(tmp_path, e_step=2)
    assert tt.found(tmp_path, "budget.seqs") == []


# --- budget.tokens ------------------------------------------------------------------------------

def _two_prefills(tmp_path, b_chunk):
    # a 20-token prompt and a 13-token one arrive together; b's prefill may be chunked (then
    # its 13th token crosses into a fourth block in step 1)
    b_blocks = [5, 6, 7, 8]
    n = -(-b_chunk // 4)
    write(tmp_path, 2,
          [new(0, "a", 0, 20, [0, 1, 2, 3, 4]), new(0, "b", 0, b_chunk, b_blocks[:n], pos=1),
           cached(1, "a", 20, 1), cached(1, "b", b_chunk, 1, b_blocks[n:] or None, pos=1)],
          requests=[intro(0, "a", 20), intro(0, "b", 13, pos=1)])


def test_tokens_two_whole_prefills_over_budget(tmp_path):
    """Two prefills scheduled whole in one step add up to 33 tokens, one over the budget the
    worker's buffers were sized for."""
    _two_prefills(tmp_path, b_chunk=13)
    assert tt.found(tmp_path, "budget.tokens") == [
        (0, None, "33 tokens > max_num_batched_tokens 32")]


def test_tokens_chunked_prefill_fills_the_budget(tmp_path):
    """Near miss: chunked prefill schedules 12 of the second prompt's 13 tokens, exactly
    filling the 32-token budget, and the last one in the next step."""
    _two_prefills(tmp_path, b_chunk=12)
    assert tt.found(tmp_path, "budget.tokens") == []
