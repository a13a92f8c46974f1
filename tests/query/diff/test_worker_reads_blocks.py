"""Diff tests of the block reads docs/worker-reads.md listed as unguarded: the blocks the worker
zeroes (new_block_ids_to_zero), the same block twice in one grant, and a block table wider than
the worker's row.

The look-alike engine has 16 KV blocks of 4 tokens and max_model_len 64 (tinytrace.SETTINGS): a
row of the worker's block table is 16 blocks wide."""

from __future__ import annotations

import tinytrace as tt
from tinytrace import cached, intro, new, resumed


def write(tmp_path, n_steps, scheduled, zero=None, settings=None, **tables):
    """Steps 0..n_steps-1, each step's total the sum of its rows' tokens; `zero`: step ->
    new_block_ids_to_zero (NULL elsewhere, as the scheduler sends it when nothing needs
    zeroing)."""
    zero = zero or {}

    def total(i):
        return sum(r["num_scheduled_tokens"] or 0 for r in scheduled if r["step"] == i)

    steps = tt.steps(n_steps, total_num_scheduled_tokens=total,
                     new_block_ids_to_zero=lambda i: zero.get(i))
    return tt.write(tmp_path, {"steps": steps, "scheduled": scheduled, **tables},
                    settings=settings)


# --- blocks.zeroed_out_of_range ----------------------------------------------------------------

def test_zeroed_out_of_range_past_the_cache_and_below_zero(tmp_path):
    """A step's list to zero names ids past the 16 blocks and one below 0: one row for the step,
    the range of the bad ids alone (block 3, the one just granted, is fine)."""
    write(tmp_path, 2, [new(0, "a", 0, 4, [1]), cached(1, "a", 4, 1, [3])],
          zero={0: [1], 1: [3, 17, -1, 16]}, requests=[intro(0, "a", 4)])
    assert tt.found(tmp_path, "blocks.zeroed_out_of_range") == [
        (1, None, "block id -1..17 to zero outside 0..15")]


def test_zeroed_out_of_range_last_block_is_in_range(tmp_path):
    """Near miss: zeroing block 15, the cache's last, and on an engine of 32 blocks, 16 too."""
    write(tmp_path, 2, [new(0, "a", 0, 8, [14, 15]), cached(1, "a", 8, 1, [16])],
          zero={0: [14, 15], 1: [16]}, requests=[intro(0, "a", 8)],
          settings={"num_kv_blocks": 32})
    assert tt.found(tmp_path, "blocks.zeroed_out_of_range") == []
    write(tmp_path, 1, [new(0, "a", 0, 8, [14, 15])], zero={0: [14, 15]},
          requests=[intro(0, "a", 8)])
    assert tt.found(tmp_path, "blocks.zeroed_out_of_range") == []


# --- blocks.zeroed_held ------------------------------------------------------------------------

def test_zeroed_held_a_running_requests_filled_block(tmp_path):
    """a fills blocks 1 and 2 at step 0; at step 1, decoding with no new block, its block 2 is
    zeroed: the worker wipes KV that a still attends to."""
    write(tmp_path, 3, [new(0, "a", 0, 7, [1, 2]), cached(1, "a", 7, 1), cached(2, "a", 8, 1, [3])],
          zero={0: [1, 2], 1: [2], 2: [3]}, requests=[intro(0, "a", 7)])
    assert tt.found(tmp_path, "blocks.zeroed_held") == [
        (1, "a", "1 block(s) it holds zeroed (e.g. 2), held since step 0")]


def test_zeroed_held_own_new_blocks_are_what_the_list_is_for(tmp_path):
    """Near miss: the same request with each block zeroed in the step it is granted, a new
    request's whole table and a running request's appended block alike."""
    write(tmp_path, 3, [new(0, "a", 0, 7, [1, 2]), cached(1, "a", 7, 1), cached(2, "a", 8, 1, [3])],
          zero={0: [1, 2], 2: [3]}, requests=[intro(0, "a", 7)])
    assert tt.found(tmp_path, "blocks.zeroed_held") == []


def _reuse_after_finish(tmp_path, zero_step):
    # a finishes after step 1 (its blocks go back to the pool then); b is given a's block 2
    write(tmp_path, 3,
          [new(0, "a", 0, 7, [1, 2]), cached(1, "a", 7, 1), new(zero_step, "b", 0, 4, [2], pos=0)],
          zero={0: [1, 2], zero_step: [2]},
          requests=[intro(0, "a", 7), intro(zero_step, "b", 4)],
          finish_events=[{"step": 1, "req_id": "a", "reason": "LENGTH",
                          "source": "update_from_output"}])


def test_zeroed_held_reused_the_step_after_the_finish(tmp_path):
    """Near miss: a's finish event comes with step 1's output, so at step 2 its blocks are free,
    and zeroing block 2 for b, who gets it, is the list's purpose."""
    _reuse_after_finish(tmp_path, zero_step=2)
    assert tt.found(tmp_path, "blocks.zeroed_held") == []


def test_zeroed_held_reused_in_the_finishing_step(tmp_path):
    """The same zeroing one step early, in the step a still runs in: a's block is wiped under it
    (and b is handed a live block, which blocks.double_owner reports)."""
    _reuse_after_finish(tmp_path, zero_step=1)
    assert tt.found(tmp_path, "blocks.zeroed_held") == [
        (1, "a", "1 block(s) it holds zeroed (e.g. 2), held since step 0")]


def test_zeroed_held_preempted_in_the_same_step(tmp_path):
    """Near miss: a is preempted at step 1, which frees its blocks at once; b is given a's block
    2 in that step, and it is zeroed. Later, a is resumed with a new table, zeroed too."""
    write(tmp_path, 3,
          [new(0, "a", 0, 7, [1, 2]), new(1, "b", 0, 4, [2]), cached(2, "b", 4, 1, [3]),
           resumed(2, "a", 0, 7, [1, 4], pos=1)],
          zero={0: [1, 2], 1: [2], 2: [3, 1, 4]},
          requests=[intro(0, "a", 7), intro(1, "b", 4)],
          preempted=[{"step": 1, "req_id": "a"}])
    assert tt.found(tmp_path, "blocks.zeroed_held") == []


def test_zeroed_held_every_holder_of_a_shared_block(tmp_path):
    """b's first 4 tokens are a prefix hit on a's full block 1 (legal sharing, not zeroed at its
    admission, which zeroes b's own block 3 alone); zeroing block 1 at step 2 wipes it for both."""
    write(tmp_path, 3,
          [new(0, "a", 0, 7, [1, 2]), cached(1, "a", 7, 1), new(1, "b", 4, 4, [1, 3], pos=0),
           cached(2, "a", 8, 1, [5]), cached(2, "b", 8, 1, [6], pos=1)],
          zero={0: [1, 2], 1: [3], 2: [5, 6, 1]},
          requests=[intro(0, "a", 7), intro(1, "b", 8)])
    assert tt.found(tmp_path, "blocks.zeroed_held") == [
        (2, "a", "1 block(s) it holds zeroed (e.g. 1), held since step 0"),
        (2, "b", "1 block(s) it holds zeroed (e.g. 1), held since step 1")]


def test_zeroed_held_null_block_is_not_compared(tmp_path):
    """Near miss: block 0 is vLLM's null block (a sliding window's skipped entries), all zeros
    by design: a request's table holding it while it is zeroed is no loss."""
    write(tmp_path, 2, [new(0, "a", 0, 8, [0, 2]), cached(1, "a", 8, 1, [3])],
          zero={0: [2], 1: [3, 0]}, requests=[intro(0, "a", 8)])
    assert tt.found(tmp_path, "blocks.zeroed_held") == []
