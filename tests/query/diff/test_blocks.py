"""Diff tests of the block checks (blocks.*): tiny traces that break or just keep vLLM's
contract on block ids and block tables, with the exact rows each check must return.

The look-alike engine has 16 KV blocks of 4 tokens (tinytrace.SETTINGS)."""

from __future__ import annotations

import tinytrace as tt
from tinytrace import cached, intro, new, resumed


def write(tmp_path, n_steps, scheduled, settings=None, **tables):
    """The trace with steps 0..n_steps-1, each step's total the sum of its rows' tokens."""
    def total(i):
        return sum(r["num_scheduled_tokens"] or 0 for r in scheduled if r["step"] == i)
    steps = tt.steps(n_steps, total_num_scheduled_tokens=total)
    return tt.write(tmp_path, {"steps": steps, "scheduled": scheduled, **tables},
                    settings=settings)


# --- blocks.out_of_range -----------------------------------------------------------------------

def test_out_of_range_new_request_past_the_cache(tmp_path):
    """A new request's table runs past the last of the 16 KV blocks: the row's ids beyond the
    cache are reported as one range (its block 15 is fine)."""
    write(tmp_path, 1, [new(0, "a", 0, 8, [13, 14]), new(0, "b", 0, 12, [15, 16, 17], pos=1)],
          requests=[intro(0, "a", 8), intro(0, "b", 12, pos=1)])
    assert tt.found(tmp_path, "blocks.out_of_range") == [
        (0, "b", "block id 16..17 outside 0..15")]


def test_out_of_range_last_blocks_are_in_range(tmp_path):
    """Near miss: the same two requests on the cache's last five blocks (15 is the last id)."""
    write(tmp_path, 1, [new(0, "a", 0, 8, [11, 12]), new(0, "b", 0, 12, [13, 14, 15], pos=1)],
          requests=[intro(0, "a", 8), intro(0, "b", 12, pos=1)])
    assert tt.found(tmp_path, "blocks.out_of_range") == []


def _decode_into_block_8(tmp_path, num_kv_blocks):
    # a request fills blocks 6 and 7, then crosses into a third block, given id 8
    write(tmp_path, 3,
          [new(0, "a", 0, 8, [6, 7]), cached(1, "a", 8, 1, [8]), cached(2, "a", 9, 1)],
          requests=[intro(0, "a", 8)], settings={"num_kv_blocks": num_kv_blocks})


def test_out_of_range_cached_grant_past_a_smaller_cache(tmp_path):
    """A running request's appended block (new_block_ids of a cached request) is checked
    against the engine's own num_kv_blocks: 8 here, so id 8 is one past the end."""
    _decode_into_block_8(tmp_path, num_kv_blocks=8)
    assert tt.found(tmp_path, "blocks.out_of_range") == [(1, "a", "block id 8..8 outside 0..7")]


def test_out_of_range_same_grant_fits_the_default_cache(tmp_path):
    """Near miss: the same rows in an engine of 16 blocks, where id 8 exists."""
    _decode_into_block_8(tmp_path, num_kv_blocks=16)
    assert tt.found(tmp_path, "blocks.out_of_range") == []


# --- blocks.double_owner ------------------------------------------------------------------------

def _second_request_shares_block(tmp_path, b_computed, b_blocks):
    # a: 7 prompt tokens in blocks 1 (full) and 2 (3 of 4 slots), then decoding; b arrives at
    # step 1 with an 8-token prompt (block 0 is vLLM's null block, never handed out)
    write(tmp_path, 2,
          [new(0, "a", 0, 7, [1, 2]),
           cached(1, "a", 7, 1), new(1, "b", b_computed, 8 - b_computed, b_blocks)],
          requests=[intro(0, "a", 7), intro(1, "b", 8)])


def test_double_owner_new_request_takes_a_live_block(tmp_path):
    """A new request with no prefix hit is handed block 1 while the running request that was
    given it still holds it: two requests would write KV into one block."""
    _second_request_shares_block(tmp_path, b_computed=0, b_blocks=[2, 3])
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (1, "b", "1 block(s) (e.g. 2) still held by a; prefix hits cover 0")]


def test_double_owner_prefix_hit_shares_a_full_block(tmp_path):
    """Near miss: prefix caching. The new request's first 4 tokens are a hit on a's full
    block 1 (num_computed_tokens 4 covers one block), so sharing that one block is legal."""
    _second_request_shares_block(tmp_path, b_computed=4, b_blocks=[1, 3])
    assert tt.found(tmp_path, "blocks.double_owner") == []


def _reuse_after_finish(tmp_path, b_step):
    # a finishes in step 1's update (delivered in step 2); b is handed both of a's blocks
    write(tmp_path, 3,
          [new(0, "a", 0, 7, [1, 2]), cached(1, "a", 7, 1), new(b_step, "b", 0, 8, [1, 2])],
          requests=[intro(0, "a", 7), intro(b_step, "b", 8)],
          finish_events=[{"step": 1, "req_id": "a", "reason": "LENGTH",
                          "source": "update_from_output", "t_ns": 1500}],
          finished=[{"step": 2, "req_id": "a"}])


def test_double_owner_blocks_reused_in_the_finishing_step(tmp_path):
    """A request finishes in step 1's update, after step 1 was scheduled: handing its blocks
    to another request in step 1 itself gives them two holders for that step."""
    _reuse_after_finish(tmp_path, b_step=1)
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (1, "b", "2 block(s) (e.g. 1) still held by a; prefix hits cover 0")]


def test_double_owner_blocks_reused_after_finish(tmp_path):
    """Near miss: the finished request's blocks go back to the pool in step 1's update, so
    step 2 may hand them out again."""
    _reuse_after_finish(tmp_path, b_step=2)
    assert tt.found(tmp_path, "blocks.double_owner") == []



def _in_flight_grant_after_finish(tmp_path, b_step):
    # two batches in flight (found by the clean-run property test on vLLM 0.32's
    # AsyncScheduler): step 2 is scheduled before step 1's update, in which a finishes, so
    # step 2 still grants a block 3; that update's free releases it with the rest
    write(tmp_path, 5,
          [new(0, "a", 0, 7, [1, 2]), cached(1, "a", 7, 1), cached(2, "a", 8, 1, [3]),
           new(b_step, "b", 0, 4, [3])],
          requests=[intro(0, "a", 7), intro(b_step, "b", 4)],
          finish_events=[{"step": 1, "req_id": "a", "reason": "LENGTH",
                          "source": "update_from_output", "t_ns": 2500}],
          finished=[{"step": 3, "req_id": "a"}])


def test_double_owner_block_granted_in_flight_after_the_finish_is_free_later(tmp_path):
    """Near miss: the block granted in flight goes back to the pool with the finish, so a
    step after that grant may hand it out again."""
    _in_flight_grant_after_finish(tmp_path, b_step=3)
    assert tt.found(tmp_path, "blocks.double_owner") == []


def test_double_owner_block_granted_in_flight_is_held_in_its_own_step(tmp_path):
    """The edge: in the step of the in-flight grant itself the block is a's."""
    _in_flight_grant_after_finish(tmp_path, b_step=2)
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (2, "b", "1 block(s) (e.g. 3) still held by a; prefix hits cover 0")]

def test_double_owner_blocks_of_a_preempted_request(tmp_path):
    """A request preempted in step 1 gives its blocks up in that very step's schedule(): the
    request admitted in its place may take them at once."""
    write(tmp_path, 2, [new(0, "a", 0, 7, [1, 2]), new(1, "b", 0, 8, [1, 2])],
          requests=[intro(0, "a", 7), intro(1, "b", 8)],
          preempted=[{"step": 1, "req_id": "a"}])
    assert tt.found(tmp_path, "blocks.double_owner") == []


def test_double_owner_running_request_appends_a_held_block(tmp_path):
    """A running (cached) request crosses into a new block and is given one another request
    holds: prefix hits never excuse a block appended to a running request."""
    write(tmp_path, 2,
          [new(0, "a", 0, 7, [1, 2]), new(0, "b", 0, 4, [3], pos=1),
           cached(1, "a", 7, 1), cached(1, "b", 4, 1, [2], pos=1)],
          requests=[intro(0, "a", 7), intro(0, "b", 4, pos=1)])
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (1, "b", "1 block(s) (e.g. 2) still held by a; prefix hits cover 1")]


# --- blocks.table_short -------------------------------------------------------------------------

def _decode_past_two_blocks(tmp_path, third_block):
    # 7 prompt tokens in 2 blocks (8 slots); the second decode step needs a 9th slot
    write(tmp_path, 3,
          [new(0, "a", 0, 7, [0, 1]), cached(1, "a", 7, 1), cached(2, "a", 8, 1, third_block)],
          requests=[intro(0, "a", 7)])


def test_table_short_decode_without_a_new_block(tmp_path):
    """A decoding request crosses from its 8th slot into a 9th without being given a block:
    the worker would map token 9 through a stale table entry."""
    _decode_past_two_blocks(tmp_path, third_block=None)
    assert tt.found(tmp_path, "blocks.table_short") == [
        (2, "a", "block table of 2 blocks (8 slots) for 9 tokens")]


def test_table_short_decode_with_its_new_block(tmp_path):
    """Near miss: the same step appends block 2, so 3 blocks (12 slots) hold the 9 tokens."""
    _decode_past_two_blocks(tmp_path, third_block=[2])
    assert tt.found(tmp_path, "blocks.table_short") == []


def _resume_after_preemption(tmp_path, table):
    # a holds 3 blocks, is preempted in step 2 and resumed in step 3, recomputing all 9 tokens
    write(tmp_path, 4,
          [new(0, "a", 0, 8, [0, 1]), cached(1, "a", 8, 1, [2]), resumed(3, "a", 0, 9, table)],
          requests=[intro(0, "a", 8)], preempted=[{"step": 2, "req_id": "a"}])


def test_table_short_resumed_table_replaces_the_old_one(tmp_path):
    """A resumed request's new_block_ids are its whole table, not blocks appended to the one
    it had before preemption: 2 blocks cannot hold its 9 tokens (3 blocks + 2 would)."""
    _resume_after_preemption(tmp_path, table=[3, 4])
    assert tt.found(tmp_path, "blocks.table_short") == [
        (3, "a", "block table of 2 blocks (8 slots) for 9 tokens")]


def test_table_short_resumed_with_a_full_table(tmp_path):
    """Near miss: resumed with a table of 3 blocks (12 slots) for its 9 tokens."""
    _resume_after_preemption(tmp_path, table=[3, 4, 5])
    assert tt.found(tmp_path, "blocks.table_short") == []
