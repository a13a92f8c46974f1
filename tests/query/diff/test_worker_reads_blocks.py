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


# --- blocks.repeated_in_grant ------------------------------------------------------------------

def test_repeated_in_grant_a_running_requests_block_twice(tmp_path):
    """A running request crossing into two blocks is given block 5 twice: its table's last two
    entries map eight positions onto four slots."""
    write(tmp_path, 2, [new(0, "a", 0, 8, [3, 4]), cached(1, "a", 8, 5, [5, 5])],
          requests=[intro(0, "a", 8)])
    assert tt.found(tmp_path, "blocks.repeated_in_grant") == [
        (1, "a", "1 block(s) given more than once (e.g. block 5, 2 times)")]


def test_repeated_in_grant_counts_each_block(tmp_path):
    """A new request's table names blocks 7 three times and 6 twice (one row, both counted)."""
    write(tmp_path, 1, [new(0, "a", 0, 24, [7, 6, 7, 8, 6, 7])], requests=[intro(0, "a", 24)])
    assert tt.found(tmp_path, "blocks.repeated_in_grant") == [
        (0, "a", "2 block(s) given more than once (e.g. block 6, 2 times)")]


def test_repeated_in_grant_null_blocks_and_other_steps(tmp_path):
    """Near miss: the null block 0 repeated (a sliding window's skipped blocks), in a table of
    three and one of two, and block 5 given to the same request again in a later step
    (blocks.double_owner's, not this check's); two distinct blocks."""
    write(tmp_path, 2, [new(0, "a", 0, 12, [0, 0, 5]), cached(1, "a", 12, 1, [5]),
                        new(1, "b", 0, 8, [0, 0], pos=0), new(1, "c", 0, 8, [6, 7], pos=1)],
          requests=[intro(0, "a", 12), intro(1, "b", 8), intro(1, "c", 8, pos=1)])
    assert tt.found(tmp_path, "blocks.repeated_in_grant") == []


# --- blocks.table_too_long ---------------------------------------------------------------------

WIDE = {"num_kv_blocks": 64}  # room for ids past 15: the table is what is too long


def test_table_too_long_one_block_past_the_row(tmp_path):
    """A request holding the 16 blocks max_model_len 64 needs is given a 17th: the worker's
    numpy assignment past the row's end (here 16 wide) raises."""
    write(tmp_path, 3, [new(0, "a", 0, 60, list(range(1, 17))), cached(1, "a", 60, 1),
                        cached(2, "a", 61, 1, [17])],
          requests=[intro(0, "a", 60)], settings=WIDE)
    assert tt.found(tmp_path, "blocks.table_too_long") == [
        (2, "a", "block table of 17 blocks, past the 16 that max_model_len 64 needs at 4 tokens "
                 "a block")]


def test_table_too_long_full_row_and_tables_replaced(tmp_path):
    """Near miss: a table of exactly 16 blocks; and a request whose resumed table replaces the
    one it lost (12 blocks, then 14: 26 given in all, never 17 at once)."""
    write(tmp_path, 4,
          [new(0, "a", 0, 48, list(range(1, 13))), cached(1, "a", 48, 4, [13]),
           cached(2, "a", 52, 8, [14, 15, 16]), cached(3, "a", 60, 1),
           new(0, "b", 0, 40, list(range(20, 30)), pos=1), cached(1, "b", 40, 8, [30, 31], pos=1),
           resumed(3, "b", 0, 56, list(range(40, 54)), pos=1)],
          requests=[intro(0, "a", 48), intro(0, "b", 40, pos=1)],
          preempted=[{"step": 2, "req_id": "b"}], settings=WIDE)
    assert tt.found(tmp_path, "blocks.table_too_long") == []


def test_table_too_long_after_a_resume(tmp_path):
    """The length counts from the last whole table: resumed with 14 blocks, b is then given 3
    more in one step (17), and one more later (reported once, at the first step past the row)."""
    write(tmp_path, 5,
          [new(0, "b", 0, 40, list(range(20, 30))), resumed(2, "b", 0, 56, list(range(40, 54))),
           cached(3, "b", 56, 4, [54, 55, 56]), cached(4, "b", 60, 1, [57])],
          requests=[intro(0, "b", 40)], preempted=[{"step": 1, "req_id": "b"}], settings=WIDE)
    assert tt.found(tmp_path, "blocks.table_too_long") == [
        (3, "b", "block table of 17 blocks, past the 16 that max_model_len 64 needs at 4 tokens "
                 "a block")]
