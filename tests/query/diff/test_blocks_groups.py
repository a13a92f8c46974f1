"""Diff tests of the block checks on engines with several KV cache groups (hybrid models): each
group's blocks follow its own manager's rules (core/kv_groups.py). Look-alike traces as in
test_blocks.py: 16 KV blocks of 4 tokens; `new_block_ids` holds one list per group, and block 0
is vLLM's null block, which sliding-window and Mamba groups repeat and nobody holds.

Whether these rules are vLLM's is what the clean hybrid runs say (tests/query/test_clean_runs.py
on the rig's hybrid scenarios, the real sliding-window and Mamba managers)."""

from __future__ import annotations

import tinytrace as tt
from tinytrace import intro

SLIDING = {"spec": "SlidingWindowSpec", "kind": "sliding_window", "block_size": 4,
           "sliding_window": 4, "layers": 1}
FULL = {"spec": "FullAttentionSpec", "kind": "full", "block_size": 4, "layers": 1}
MAMBA = {"spec": "MambaSpec", "kind": "mamba", "block_size": 4, "layers": 1,
         "mamba_cache_mode": "align"}


def row(step, rid, kind, computed, sched, groups, pos=0):
    return {"step": step, "req_id": rid, "kind": kind, "pos": pos,
            "num_computed_tokens": computed, "num_scheduled_tokens": sched,
            "new_block_ids": groups}


def write(tmp_path, n_steps, scheduled, groups, **tables):
    def total(i):
        return sum(r["num_scheduled_tokens"] or 0 for r in scheduled if r["step"] == i)
    steps = tables.pop("steps", None) or tt.steps(n_steps, total_num_scheduled_tokens=total)
    return tt.write(tmp_path, {"steps": steps, "scheduled": scheduled, **tables},
                    settings={"kv_cache_groups": groups})


# --- a sliding window frees the blocks behind it --------------------------------------------------

def _window_passes_block_1(tmp_path, b_step):
    # a (window 4, blocks of 4) prefills 8 tokens: sliding blocks 1, 2; full blocks 3, 4. At
    # step 1 it decodes with 8 computed tokens: 8 - 4 + 1 = 5 tokens skipped, one whole block,
    # so its allocation in step 1 frees sliding block 1 (table position 0). b, new, is handed
    # block 1 at b_step.
    scheduled = [row(0, "a", "new", 0, 8, [[1, 2], [3, 4]]),
                 row(1, "a", "cached", 8, 1, [[5], [6]]),
                 row(2, "a", "cached", 9, 1, None),
                 row(b_step, "b", "new", 0, 4, [[1], [7]], pos=1)]
    write(tmp_path, 3, sorted(scheduled, key=lambda r: r["step"]), [SLIDING, FULL],
          requests=[intro(0, "a", 8), intro(b_step, "b", 4, pos=1)])


def test_double_owner_window_block_handed_out_before_the_window_passes_it(tmp_path):
    """b is given sliding block 1 in step 0, while a's window (computed 0: nothing skipped)
    still covers it: a block with two holders."""
    _window_passes_block_1(tmp_path, b_step=0)
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (0, "b", "1 block(s) (e.g. 1) still held by a; prefix hits cover 0")]


def test_double_owner_window_block_reused_once_the_window_passed_it(tmp_path):
    """Near miss: in step 1 a's allocation frees block 1 (its window left it behind), and b,
    admitted after the running a, may take it in that very step."""
    _window_passes_block_1(tmp_path, b_step=1)
    assert tt.found(tmp_path, "blocks.double_owner") == []


def test_double_owner_full_group_block_is_held_to_the_end(tmp_path):
    """The same schedule, but b is handed a's full-attention block 3, which no window frees:
    reported although a's sliding window has passed position 0."""
    scheduled = [row(0, "a", "new", 0, 8, [[1, 2], [3, 4]]),
                 row(1, "a", "cached", 8, 1, [[5], [6]]),
                 row(1, "b", "new", 0, 4, [[7], [3]], pos=1),
                 row(2, "a", "cached", 9, 1, None)]
    write(tmp_path, 3, scheduled, [SLIDING, FULL],
          requests=[intro(0, "a", 8), intro(1, "b", 4, pos=1)])
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (1, "b", "1 block(s) (e.g. 3) still held by a; prefix hits cover 0")]


def test_double_owner_null_blocks_are_nobodys(tmp_path):
    """Near miss: two requests' sliding tables both begin with the null block 0 (a prefix hit
    behind the window), as vLLM hands them out."""
    scheduled = [row(0, "a", "new", 0, 8, [[1, 2], [3, 4]]),
                 row(1, "a", "cached", 8, 1, [[5], [6]]),
                 row(1, "b", "new", 4, 4, [[0, 7], [3, 8]], pos=1)]
    write(tmp_path, 2, scheduled, [SLIDING, FULL],
          requests=[intro(0, "a", 8), intro(1, "b", 8, pos=1)])
    assert tt.found(tmp_path, "blocks.double_owner") == []


def test_double_owner_prefix_hits_are_counted_per_group(tmp_path):
    """Near miss: b's 4-token prefix hit shares a's first block in each of two full-attention
    groups: two shared blocks, one per group, both covered by num_computed_tokens 4."""
    scheduled = [row(0, "a", "new", 0, 8, [[1, 2], [3, 4]]),
                 row(1, "a", "cached", 8, 1, None),
                 row(1, "b", "new", 4, 4, [[1, 5], [3, 6]], pos=1)]
    write(tmp_path, 2, scheduled, [FULL, {**FULL}],
          requests=[intro(0, "a", 8), intro(1, "b", 8, pos=1)])
    assert tt.found(tmp_path, "blocks.double_owner") == []


def test_double_owner_a_hit_beyond_the_groups_prefix(tmp_path):
    """b shares a's first two blocks of the first group with a one-block prefix hit: one
    shared block more than the two groups' prefixes allow (4 // 4 each)."""
    scheduled = [row(0, "a", "new", 0, 8, [[1, 2], [3, 4]]),
                 row(1, "a", "cached", 8, 1, None),
                 row(1, "b", "new", 4, 4, [[1, 2], [3, 6]], pos=1)]
    write(tmp_path, 2, scheduled, [FULL, {**FULL}],
          requests=[intro(0, "a", 8), intro(1, "b", 8, pos=1)])
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (1, "b", "3 block(s) (e.g. 1) still held by a; prefix hits cover 2")]


# --- a Mamba group keeps only the last state ------------------------------------------------------

def _mamba_state_moves_on(tmp_path, b_step):
    # a (Mamba "align", blocks of 4) prefills 4 tokens: state block 1 at position 0. Step 1
    # schedules 4 more (computed 4): its state goes to block 2 at position 1; the state in
    # block 1 is read as the step's start. Step 2 (computed 8 > 4 + 1): block 1 is freed.
    scheduled = [row(0, "a", "new", 0, 4, [[1], [3]]),
                 row(1, "a", "cached", 4, 4, [[2], [4]]),
                 row(2, "a", "cached", 8, 1, [[5], [6]]),
                 row(b_step, "b", "new", 0, 4, [[1], [7]], pos=1)]
    write(tmp_path, 3, sorted(scheduled, key=lambda r: r["step"]), [MAMBA, FULL],
          requests=[intro(0, "a", 4), intro(b_step, "b", 4, pos=1)],
          steps=tt.steps(3, total_num_scheduled_tokens=lambda i: sum(
              r["num_scheduled_tokens"] for r in scheduled if r["step"] == i),
              new_block_ids_to_zero=lambda i: [1] if i == b_step else None))


def test_mamba_state_block_handed_out_while_its_state_is_read(tmp_path):
    """b's new state block is a's block 1 in step 1, where a's step still starts from the
    state in it: double_owner, and zeroing it wipes the state a reads (zeroed_held)."""
    _mamba_state_moves_on(tmp_path, b_step=1)
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (1, "b", "1 block(s) (e.g. 1) still held by a; prefix hits cover 0")]
    assert tt.found(tmp_path, "blocks.zeroed_held") == [
        (1, "a", "1 block(s) it holds zeroed (e.g. 1), held since step 0")]


def test_mamba_state_block_reused_once_the_state_moved_on(tmp_path):
    """Near miss: in step 2 a's allocation frees block 1 (its state is two blocks back); b may
    take it, and it is zeroed for b."""
    _mamba_state_moves_on(tmp_path, b_step=2)
    assert tt.found(tmp_path, "blocks.double_owner") == []
    assert tt.found(tmp_path, "blocks.zeroed_held") == []


# --- blocks.null_needed -----------------------------------------------------------------------

def _hit_behind_the_window(tmp_path, sliding_ids, full_ids):
    # b's 8-token prefix hit (a's blocks 1, 2 and 3, 4), then 4 more tokens: its sliding window
    # of 4 reaches back to token 8 - 4 + 1 = 5, in table position 1, so position 0 may be null
    scheduled = [row(0, "a", "new", 0, 8, [[1, 2], [3, 4]]),
                 row(1, "a", "cached", 8, 1, [[5], [6]]),
                 row(1, "b", "new", 8, 4, [sliding_ids, full_ids], pos=1)]
    write(tmp_path, 2, scheduled, [SLIDING, FULL],
          requests=[intro(0, "a", 8), intro(1, "b", 12, pos=1)])


def test_null_needed_sliding_table_null_behind_the_window(tmp_path):
    """Near miss: b's sliding table is [null, 2, 7], as vLLM's sliding-window prefix hit
    hands it out: the null block only where the window no longer reaches."""
    _hit_behind_the_window(tmp_path, [0, 2, 7], [3, 4, 8])
    assert tt.found(tmp_path, "blocks.null_needed") == []


def test_null_needed_sliding_table_null_inside_the_window(tmp_path):
    """b's sliding table is [null, null, 7]: position 1 holds tokens 4-7, of which 5-7 are
    in the window of b's first scheduled token."""
    _hit_behind_the_window(tmp_path, [0, 0, 7], [3, 4, 8])
    assert tt.found(tmp_path, "blocks.null_needed") == [
        (1, "b", "KV cache group 0 (sliding_window): the null block at table position 1, "
                 "which its attention reads (positions from 1 on)")]


def test_null_needed_full_attention_table_has_no_null(tmp_path):
    """A full-attention group reads every position: the null block anywhere in it is wrong,
    also appended to a running request."""
    _hit_behind_the_window(tmp_path, [0, 2, 7], [3, 4, 0])
    assert tt.found(tmp_path, "blocks.null_needed") == [
        (1, "b", "KV cache group 1 (full): the null block at table position 2, "
                 "which its attention reads (positions from 0 on)")]


def _mamba_grant(tmp_path, state_ids):
    # a Mamba ("align") request past its first block: its step 1 grant pads the table with a
    # null and ends with the block its state is written to
    scheduled = [row(0, "a", "new", 0, 4, [[1], [3]]),
                 row(1, "a", "cached", 4, 4, [state_ids, [4]])]
    write(tmp_path, 2, scheduled, [MAMBA, FULL], requests=[intro(0, "a", 8)])


def test_null_needed_mamba_state_written_to_a_real_block(tmp_path):
    """Near miss: the grant [null, 2], the last block real."""
    _mamba_grant(tmp_path, [0, 2])
    assert tt.found(tmp_path, "blocks.null_needed") == []


def test_null_needed_mamba_state_written_to_the_null_block(tmp_path):
    """The grant [2, null]: the step's state goes to the null block."""
    _mamba_grant(tmp_path, [2, 0])
    assert tt.found(tmp_path, "blocks.null_needed") == [
        (1, "a", "KV cache group 0 (mamba): the null block at table position 2, "
                 "where the step writes its state")]


def _mamba_hit(tmp_path, b_ids):
    # b hits a's first 4 tokens: its Mamba state after them is a's block 1, at position 0
    scheduled = [row(0, "a", "new", 0, 8, [[0, 1], [3, 4]]),
                 row(1, "a", "cached", 8, 1, [[2], [5]]),
                 row(1, "b", "new", 4, 4, [b_ids, [3, 6]], pos=1)]
    write(tmp_path, 2, scheduled, [MAMBA, FULL],
          requests=[intro(0, "a", 8), intro(1, "b", 8, pos=1)])


def test_null_needed_mamba_hit_starts_from_the_hit_state(tmp_path):
    """Near miss: b's Mamba table [1, 7] starts from the hit's state in block 1."""
    _mamba_hit(tmp_path, [1, 7])
    assert tt.found(tmp_path, "blocks.null_needed") == []


def test_null_needed_mamba_group_missed_the_hit(tmp_path):
    """num_computed_tokens counts the hit, but the Mamba group's table has none: [null, 7]
    (vllm#43090's shape: the scalar count folded from the attention group's hit alone)."""
    _mamba_hit(tmp_path, [0, 7])
    assert tt.found(tmp_path, "blocks.null_needed") == [
        (1, "b", "KV cache group 0 (mamba): the null block at table position 0, the state its "
                 "computed tokens left, which the step starts from")]


# --- blocks.group_count -----------------------------------------------------------------------

def _grant_lists(tmp_path, groups_of_b):
    scheduled = [row(0, "a", "new", 0, 8, [[1, 2], [3, 4]]),
                 row(1, "a", "cached", 8, 1, None),
                 row(1, "b", "new", 0, 4, groups_of_b, pos=1)]
    write(tmp_path, 2, scheduled, [SLIDING, FULL],
          requests=[intro(0, "a", 8), intro(1, "b", 4, pos=1)])


def test_group_count_one_list_per_group(tmp_path):
    """Near miss: b's table has a list for each of the two groups."""
    _grant_lists(tmp_path, [[5], [6]])
    assert tt.found(tmp_path, "blocks.group_count") == []


def test_group_count_a_group_left_out(tmp_path):
    """b's block_ids carry one list on a two-group engine: the worker's add_row raises."""
    _grant_lists(tmp_path, [[5, 6]])
    assert tt.found(tmp_path, "blocks.group_count") == [
        (1, "b", "1 block list(s) for 2 KV cache group(s)")]
