"""Diff tests of the finished-id checks (finished.*): when a finished request's id reaches the
worker in finished_req_ids, how often, and whether the worker ever held it.

A request's finish event comes from a step's update_from_output(); its id then travels with the
next step scheduled."""

from __future__ import annotations

import tinytrace as tt


def intro(step, rid, prompt_len=8, pos=0):
    return {"step": step, "req_id": rid, "pos": pos, "prompt_len": prompt_len}


def new(step, rid, blocks, pos=0):
    """An 8-token prompt scheduled whole."""
    return {"step": step, "req_id": rid, "kind": "new", "pos": pos, "num_computed_tokens": 0,
            "num_scheduled_tokens": 8, "new_block_ids": [blocks]}


def cached(step, rid, computed, blocks=None, pos=0):
    """One decode token."""
    return {"step": step, "req_id": rid, "kind": "cached", "pos": pos,
            "num_computed_tokens": computed, "num_scheduled_tokens": 1,
            "new_block_ids": None if blocks is None else [blocks]}


def resumed(step, rid, computed, sched, blocks, pos=0):
    return {"step": step, "req_id": rid, "kind": "resumed", "resumed": True, "pos": pos,
            "num_computed_tokens": computed, "num_scheduled_tokens": sched,
            "new_block_ids": [blocks]}


def event(step, rid, t_ns=None, reason="LENGTH", source="update_from_output"):
    """A finish event seen in step's update (by default at that update's time)."""
    return {"step": step, "req_id": rid, "reason": reason, "source": source,
            "t_ns": step * 1000 + 500 if t_ns is None else t_ns}


def fin(step, rid):
    return {"step": step, "req_id": rid}


def write(tmp_path, n_steps, scheduled, steps=None, **tables):
    def total(i):
        return sum(r["num_scheduled_tokens"] for r in scheduled if r["step"] == i)
    steps = steps or tt.steps(n_steps, total_num_scheduled_tokens=total)
    return tt.write(tmp_path, {"steps": steps, "updates": tt.steps(n_steps),
                               "scheduled": scheduled, **tables})


# a request: its 8-token prompt in step 0, then a token a step in steps 1.. (block 2 from 9)
A_DECODING = [new(0, "a", [0, 1]), cached(1, "a", 8, [2]), cached(2, "a", 9), cached(3, "a", 10)]


# --- finished.and_scheduled ---------------------------------------------------------------------

def test_and_scheduled_finished_while_running(tmp_path):
    """A running request's id arrives in finished_req_ids of a step that also schedules it as
    cached: the worker frees it, then looks it up for the step (KeyError)."""
    write(tmp_path, 4, A_DECODING, requests=[intro(0, "a")], finished=[fin(2, "a")])
    assert tt.found(tmp_path, "finished.and_scheduled") == [
        (2, "a", "in finished_req_ids and scheduled_cached_reqs of the same step")]


def test_and_scheduled_finished_after_its_last_step(tmp_path):
    """Near miss: it finishes in step 2's update and its id arrives with step 3, where it is
    no longer scheduled."""
    write(tmp_path, 4, A_DECODING[:3], requests=[intro(0, "a")], finish_events=[event(2, "a")],
          finished=[fin(3, "a")])
    assert tt.found(tmp_path, "finished.and_scheduled") == []


def test_and_scheduled_id_reused_in_the_finishing_step(tmp_path):
    """Near miss: the finished id is introduced again as new in the step that frees it: the
    worker frees the old request before it adds the new one."""
    write(tmp_path, 5, A_DECODING[:3] + [new(3, "a", [3, 4]), cached(4, "a", 8, [5])],
          requests=[intro(0, "a"), intro(3, "a")], finish_events=[event(2, "a")],
          finished=[fin(3, "a")])
    assert tt.found(tmp_path, "finished.and_scheduled") == []


def test_and_scheduled_finished_in_the_step_that_resumes_it(tmp_path):
    """A preempted request is aborted, yet resumed in the step that delivers its finished id:
    resumed requests are cached ones to the worker, so the same KeyError."""
    write(tmp_path, 4, [new(0, "a", [0, 1]), cached(1, "a", 8, [2]),
                        resumed(3, "a", 0, 9, [3, 4, 5])],
          requests=[intro(0, "a")], preempted=[fin(2, "a")],
          finish_events=[event(2, "a", reason="FINISHED_ABORTED", source="finish_requests")],
          finished=[fin(3, "a")])
    assert tt.found(tmp_path, "finished.and_scheduled") == [
        (3, "a", "in finished_req_ids and scheduled_cached_reqs of the same step")]


# --- finished.duplicate -------------------------------------------------------------------------

def test_duplicate_delivered_twice(tmp_path):
    """A request that finished once has its id delivered again two steps later, with no new
    request of that id in between: the scheduler freed it twice."""
    write(tmp_path, 5, A_DECODING[:2], requests=[intro(0, "a")], finish_events=[event(1, "a")],
          finished=[fin(2, "a"), fin(4, "a")])
    assert tt.found(tmp_path, "finished.duplicate") == [(4, "a", "already delivered at step 2")]


def test_duplicate_id_reused_between_deliveries(tmp_path):
    """Near miss: the id is introduced again (step 2, the very step of its first delivery)
    and that second request's finish is delivered in step 4."""
    write(tmp_path, 5, A_DECODING[:2] + [new(2, "a", [3, 4]), cached(3, "a", 8, [5])],
          requests=[intro(0, "a"), intro(2, "a")], finish_events=[event(1, "a"), event(3, "a")],
          finished=[fin(2, "a"), fin(4, "a")])
    assert tt.found(tmp_path, "finished.duplicate") == []



def added(step, rid, seq=0):
    """An add_request() of `rid` logged after step's schedule()."""
    return {"step": step, "seq": seq, "req_id": rid}


def _delivered_at_2_and_4(tmp_path, adds):
    write(tmp_path, 5, A_DECODING[:2], requests=[intro(0, "a")], finish_events=[event(1, "a")],
          finished=[fin(2, "a"), fin(4, "a")], added=[added(-1, "a")] + adds)
    return tt.found(tmp_path, "finished.duplicate")


def test_duplicate_readded_and_aborted_before_it_ran(tmp_path):
    """Near miss (vLLM 0.32, found by the clean-run property test): the id is added again after
    its first delivery and aborted before any step schedules it. That request is freed too, so
    its id comes back, with no `requests` row between the two deliveries."""
    assert _delivered_at_2_and_4(tmp_path, [added(2, "a", seq=5)]) == []


def test_duplicate_readded_right_after_the_free(tmp_path):
    """Near miss at the edge: added after step 1's schedule(), in the update of which the first
    request finished (delivered with step 2): the add may follow the free, so it counts."""
    assert _delivered_at_2_and_4(tmp_path, [added(1, "a", seq=3)]) == []


def test_duplicate_add_while_the_first_request_ran_is_no_new_request(tmp_path):
    """One below the edge: an add logged after step 0's schedule() came before the first
    request's free (step 1's update), so it is not a new request of the freed id."""
    assert _delivered_at_2_and_4(tmp_path, [added(0, "a", seq=1)]) == [
        (4, "a", "already delivered at step 2")]


def test_duplicate_add_after_the_second_delivery_is_too_late(tmp_path):
    """One above the edge: an add logged after step 4's schedule() cannot explain what step 4
    delivered."""
    assert _delivered_at_2_and_4(tmp_path, [added(4, "a", seq=9)]) == [
        (4, "a", "already delivered at step 2")]

# --- finished.leaked ----------------------------------------------------------------------------

def _finishes_at_step_2(tmp_path, n_steps, delivered, steps=None):
    write(tmp_path, n_steps, A_DECODING[:3], steps=steps, requests=[intro(0, "a")],
          finish_events=[event(2, "a")], finished=[fin(s, "a") for s in delivered])


def test_leaked_never_delivered(tmp_path):
    """A request finishes in step 2's update; steps 3 and 4 are scheduled after it, yet its id
    never reaches the worker, which keeps its state and batch slot for good."""
    _finishes_at_step_2(tmp_path, 5, delivered=[])
    assert tt.found(tmp_path, "finished.leaked") == [
        (3, "a", "finished at step 2, never reached the worker in finished_req_ids")]


def test_leaked_delivered_a_step_late(tmp_path):
    """The id skips step 3, the first scheduled after the finish, and arrives with step 4."""
    _finishes_at_step_2(tmp_path, 5, delivered=[4])
    assert tt.found(tmp_path, "finished.leaked") == [
        (3, "a", "finished at step 2, reached the worker only at step 4")]


def test_leaked_delivered_with_the_next_step(tmp_path):
    """Near miss: the id travels with step 3, the next step after the finish."""
    _finishes_at_step_2(tmp_path, 5, delivered=[3])
    assert tt.found(tmp_path, "finished.leaked") == []


def test_leaked_no_step_after_the_finish(tmp_path):
    """Near miss: the trace ends with the finishing step (LLM.generate() does not wait for the
    zero-token step that would carry the id), so nothing was due yet."""
    _finishes_at_step_2(tmp_path, 3, delivered=[])
    assert tt.found(tmp_path, "finished.leaked") == []


def _overlapped(tmp_path, delivered):
    # async scheduling: step 3 is scheduled (t 2400) before step 2's update (t 2500) finishes
    # the request, so step 3 still lists it; the first step scheduled after the finish is 4
    t = {3: 2400}
    steps = tt.steps(6, t_ns=lambda i: t.get(i, i * 1000),
                     total_num_scheduled_tokens=lambda i: {0: 8, 1: 1, 2: 1, 3: 1}.get(i, 0))
    write(tmp_path, 6, A_DECODING, steps=steps, requests=[intro(0, "a")],
          finish_events=[event(2, "a")], finished=[fin(s, "a") for s in delivered])


def test_leaked_overlapped_delivered_late(tmp_path):
    """With overlapping batches the id is due with step 4, the first step scheduled after the
    finish; arriving with step 5 it is a step late."""
    _overlapped(tmp_path, delivered=[5])
    assert tt.found(tmp_path, "finished.leaked") == [
        (4, "a", "finished at step 2, reached the worker only at step 5")]


def test_leaked_overlapped_delivered_in_time(tmp_path):
    """Near miss: step 3 was scheduled before the finish, so step 4 is in time."""
    _overlapped(tmp_path, delivered=[4])
    assert tt.found(tmp_path, "finished.leaked") == []


# --- finished.phantom ---------------------------------------------------------------------------

def test_phantom_id_never_introduced(tmp_path):
    """An id in finished_req_ids that was never in scheduled_new_reqs (a request aborted while
    it waited): not a request the worker knew. The request that ran is not reported."""
    write(tmp_path, 4, A_DECODING[:3], requests=[intro(0, "a")],
          finish_events=[event(0, "x", reason="FINISHED_ABORTED", source="finish_requests"),
                         event(2, "a")],
          finished=[fin(1, "x"), fin(3, "a")])
    assert tt.found(tmp_path, "finished.phantom") == [
        (1, "x", "in finished_req_ids, never in scheduled_new_reqs")]


def test_phantom_aborted_after_admission(tmp_path):
    """Near miss: x is aborted in step 0's update, after it was admitted as new in step 0."""
    write(tmp_path, 4, A_DECODING[:3] + [new(0, "x", [3, 4], pos=1)],
          requests=[intro(0, "a"), intro(0, "x", pos=1)],
          finish_events=[event(0, "x", reason="FINISHED_ABORTED", source="finish_requests"),
                         event(2, "a")],
          finished=[fin(1, "x"), fin(3, "a")])
    assert tt.found(tmp_path, "finished.phantom") == []


def test_phantom_id_introduced_only_later(tmp_path):
    """x is aborted while waiting and freed in step 1; a request of the same id is introduced
    only in step 2. When step 1 freed it, the worker had never held x."""
    write(tmp_path, 4, [new(2, "x", [0, 1]), cached(3, "x", 8, [2])],
          requests=[intro(2, "x")],
          finish_events=[event(0, "x", reason="FINISHED_ABORTED", source="finish_requests")],
          finished=[fin(1, "x")])
    assert tt.found(tmp_path, "finished.phantom") == [
        (1, "x", "in finished_req_ids, never in scheduled_new_reqs")]
