"""Diff tests of the lifecycle checks: a request's introduction, preemption, resumption and free
as the worker sees them, each pinned to exact rows of a tiny hand-built trace (tinytrace)."""

from __future__ import annotations

import tinytrace as tt
from vllm_contract.replay.query.gateway import Gateway

PROMPT = 4  # every prompt here: one block of the look-alike's block_size 4


def intro(step: int, rid: str, pos: int = 0) -> dict:
    return {"step": step, "req_id": rid, "pos": pos, "prompt_len": PROMPT,
            "prompt_token_ids": list(range(PROMPT))}


def new(step: int, rid: str, blocks: list[int], pos: int = 0) -> dict:
    """The whole prompt prefilled in one step."""
    return {"step": step, "req_id": rid, "kind": "new", "pos": pos, "resumed": False,
            "num_scheduled_tokens": PROMPT, "num_computed_tokens": 0,
            "new_block_ids": [blocks]}


def cached(step: int, rid: str, computed: int, blocks: list[int] | None = None,
           pos: int = 0) -> dict:
    """One decode token; the prefill sampled the first output token."""
    return {"step": step, "req_id": rid, "kind": "cached", "pos": pos, "resumed": False,
            "num_scheduled_tokens": 1, "num_computed_tokens": computed,
            "num_output_tokens": computed - PROMPT + 1,
            "new_block_ids": None if blocks is None else [blocks]}


def resumed(step: int, rid: str, outputs: int, blocks: list[int] | None,
            pos: int = 0) -> dict:
    """After a preemption: everything recomputed (no prefix cache) into a whole new table."""
    return {"step": step, "req_id": rid, "kind": "resumed", "pos": pos, "resumed": True,
            "num_scheduled_tokens": PROMPT + outputs, "num_computed_tokens": 0,
            "num_output_tokens": outputs, "new_block_ids": None if blocks is None else [blocks]}


def event(step: int, rid: str, reason: str = "LENGTH",
          source: str = "update_from_output") -> dict:
    return {"step": step, "req_id": rid, "reason": reason, "source": source,
            "t_ns": step * 1000 + 500}


def freed(step: int, rid: str) -> dict:
    return {"step": step, "req_id": rid}


def write(tmp_path, n_steps: int, requests: list[dict], scheduled: list[dict],
          finished: list[dict] = (), finish_events: list[dict] = (),
          preempted: list[dict] = (), waiting: dict[int, int] | None = None,
          **manifest) -> None:
    """A trace whose steps agree with its rows: every listed request counts as running (these
    traces have no partly-scheduled batch), `waiting` as given per step (else none)."""
    waiting = waiting or {}

    def listed(i: int) -> list[dict]:
        return [r for r in scheduled if r["step"] == i]

    steps = tt.steps(
        n_steps,
        total_num_scheduled_tokens=lambda i: sum(r["num_scheduled_tokens"] for r in listed(i)),
        num_new=lambda i: sum(r["kind"] == "new" for r in listed(i)),
        num_cached=lambda i: sum(r["kind"] != "new" for r in listed(i)),
        num_finished=lambda i: sum(f["step"] == i for f in finished),
        num_running=lambda i: len(listed(i)),
        num_waiting=lambda i: waiting.get(i, 0))
    tt.write(tmp_path, {"steps": steps, "requests": requests, "scheduled": scheduled,
                        "finished": list(finished), "finish_events": list(finish_events),
                        "preempted": list(preempted)}, **manifest)


def plain(root, rid: str) -> bool:
    """Whether run_groups counts the id as plain (read without the window)."""
    with Gateway(root) as gw:
        return gw.sql(f"SELECT plain FROM run_groups WHERE req_id = '{rid}'").to_pylist()[0][
            "plain"]


# --- lifecycle.abandoned ---------------------------------------------------------------------

def _abandoned_base() -> dict:
    """a and b prefill at step 0 and decode at step 1; b finishes then and is freed at step 2,
    when nothing runs or waits. What happens to a is each test's."""
    return {"requests": [intro(0, "a"), intro(0, "b", pos=1)],
            "scheduled": [new(0, "a", [0]), new(0, "b", [1], pos=1),
                          cached(1, "a", 4, [2]), cached(1, "b", 4, [3], pos=1)],
            "finish_events": [event(1, "b")],
            "finished": [freed(2, "b")]}


def test_abandoned_request_the_scheduler_dropped(tmp_path):
    """A running request the scheduler forgets (no finish event, never freed) while it goes
    idle: the worker keeps it for the life of the process. Reported at the last step."""
    write(tmp_path, 3, **_abandoned_base())
    assert tt.found(tmp_path, "lifecycle.abandoned") == [
        (2, "a", "introduced at step 0, never finished; the scheduler is idle")]


def test_abandoned_not_when_finished_and_freed(tmp_path):
    """The same run with a finished and freed like b: the normal end."""
    t = _abandoned_base()
    t["finish_events"].append(event(1, "a"))
    t["finished"].insert(0, freed(2, "a"))
    write(tmp_path, 3, **t)
    assert tt.found(tmp_path, "lifecycle.abandoned") == []


def test_abandoned_not_while_requests_wait(tmp_path):
    """The same run whose last step still has a request waiting: the scheduler is not idle (a
    may be that request), so the trace cannot tell a forgotten request."""
    write(tmp_path, 3, **_abandoned_base(), waiting={2: 1})
    assert tt.found(tmp_path, "lifecycle.abandoned") == []


def test_abandoned_not_when_the_trace_ends_unclean(tmp_path):
    """The same run cut short (the manifest says it did not close cleanly): its last step is
    not the scheduler's last word."""
    write(tmp_path, 3, **_abandoned_base(), closed_cleanly=False)
    assert tt.found(tmp_path, "lifecycle.abandoned") == []


def test_abandoned_not_when_finished_but_delivery_after_the_end(tmp_path):
    """a finished (a finish event) but its id never reached finished_req_ids within the trace:
    a delivery after the trace's end is how a run ends, not an abandoned request (whether it
    never comes is finished.leaked's question)."""
    t = _abandoned_base()
    t["finish_events"].append(event(1, "a"))
    write(tmp_path, 3, **t)
    assert tt.found(tmp_path, "lifecycle.abandoned") == []


def test_abandoned_reused_id_judged_by_its_last_instance(tmp_path):
    """a finishes and is freed at step 2, where its id is introduced again; that second
    instance is then dropped. The first instance's finish event does not excuse it."""
    write(tmp_path, 5,
          requests=[intro(0, "a"), intro(2, "a")],
          scheduled=[new(0, "a", [0]), cached(1, "a", 4, [1]),
                     new(2, "a", [2]), cached(3, "a", 4, [3])],
          finish_events=[event(1, "a")],
          finished=[freed(2, "a")])
    assert tt.found(tmp_path, "lifecycle.abandoned") == [
        (4, "a", "introduced at step 2, never finished; the scheduler is idle")]


# --- lifecycle.new_while_live ----------------------------------------------------------------

def _reintroduced(finish_events: list[dict], finished: list[dict]) -> dict:
    """a runs steps 0-2 and is introduced again at step 3 (as new, its id reused)."""
    return {"requests": [intro(0, "a"), intro(3, "a")],
            "scheduled": [new(0, "a", [0]), cached(1, "a", 4, [1]), cached(2, "a", 5),
                          new(3, "a", [2]), cached(4, "a", 4, [3])],
            "finish_events": finish_events, "finished": finished}


def test_new_while_live_reintroduced_without_a_free(tmp_path):
    """An id introduced again while the worker still holds its previous instance (never
    finished, never freed): the worker would take the new request for a streaming update."""
    write(tmp_path, 5, **_reintroduced([], []))
    assert tt.found(tmp_path, "lifecycle.new_while_live") == [
        (3, "a", "introduced again while the instance from step 0 is still held by the worker "
                 "(never in finished_req_ids)")]


def test_new_while_live_not_when_freed_in_the_same_step(tmp_path):
    """The previous instance finished at step 2 and is freed in step 3's finished_req_ids, the
    step that introduces the id again: the worker frees before it adds, so this is id reuse."""
    write(tmp_path, 5, **_reintroduced([event(2, "a")], [freed(3, "a")]))
    assert tt.found(tmp_path, "lifecycle.new_while_live") == []


def test_new_while_live_not_for_a_streaming_turn(tmp_path):
    """The previous instance finished a turn (a finish event) and was never freed: a
    streaming-input session re-sent as new is a streaming update, meant as such."""
    write(tmp_path, 5, **_reintroduced([event(2, "a", reason="STOP")], []))
    assert tt.found(tmp_path, "lifecycle.new_while_live") == []


# --- lifecycle.resumed_without_blocks --------------------------------------------------------

def _preempted_and_resumed(tmp_path, blocks: list[int] | None) -> None:
    """a prefills, decodes once, is preempted at step 2 and resumed at step 3 with its two
    outputs recomputed (6 tokens: two blocks)."""
    write(tmp_path, 5,
          requests=[intro(0, "a")],
          scheduled=[new(0, "a", [0]), cached(1, "a", 4, [1]),
                     resumed(3, "a", 2, blocks), cached(4, "a", 6)],
          preempted=[freed(2, "a")], waiting={2: 1})


def test_resumed_without_blocks(tmp_path):
    """A resumed request without new_block_ids: the worker asserts its replacement table is
    not None (else it would read the blocks it lost)."""
    _preempted_and_resumed(tmp_path, None)
    assert tt.found(tmp_path, "lifecycle.resumed_without_blocks") == [
        (3, "a", "resumed with new_block_ids = None")]


def test_resumed_with_blocks(tmp_path):
    """The same resumption with its whole new table; the cached rows without new blocks
    (None) are fine: only a resumed row must carry one."""
    _preempted_and_resumed(tmp_path, [2, 3])
    assert tt.found(tmp_path, "lifecycle.resumed_without_blocks") == []


# --- lifecycle.preempted_not_resumed ---------------------------------------------------------

def back_as_cached(step: int, rid: str, outputs: int, blocks: list[int]) -> dict:
    """A resumed row (the whole recomputed table) with its id left out of resumed_req_ids."""
    return dict(resumed(step, rid, outputs, blocks), kind="cached", resumed=False)


def test_preempted_not_resumed(tmp_path):
    """a is preempted at step 2 and comes back at step 3 with a whole new table, but not in
    resumed_req_ids: the worker appends blocks 2 and 3 to the table [0, 1] it kept, whose
    blocks were freed at the preemption."""
    write(tmp_path, 5,
          requests=[intro(0, "a")],
          scheduled=[new(0, "a", [0]), cached(1, "a", 4, [1]),
                     back_as_cached(3, "a", 2, [2, 3]), cached(4, "a", 6)],
          preempted=[freed(2, "a")], waiting={2: 1})
    assert tt.found(tmp_path, "lifecycle.preempted_not_resumed") == [
        (3, "a", "scheduled as cached after its preemption at step 2, not in resumed_req_ids")]


def test_preempted_not_resumed_the_second_time(tmp_path):
    """Resumed properly after its preemption at step 2, then preempted again at step 5 and
    back at step 6 as cached: each preemption is judged by the row that follows it."""
    write(tmp_path, 7,
          requests=[intro(0, "a")],
          scheduled=[new(0, "a", [0]), cached(1, "a", 4, [1]),
                     resumed(3, "a", 2, [2, 3]), cached(4, "a", 6),
                     back_as_cached(6, "a", 4, [4, 5])],
          preempted=[freed(2, "a"), freed(5, "a")], waiting={2: 1, 5: 1})
    assert tt.found(tmp_path, "lifecycle.preempted_not_resumed") == [
        (6, "a", "scheduled as cached after its preemption at step 5, not in resumed_req_ids")]


def test_preempted_and_resumed(tmp_path):
    """Near miss: the same preemption, and a back at step 3 in resumed_req_ids."""
    _preempted_and_resumed(tmp_path, [2, 3])
    assert tt.found(tmp_path, "lifecycle.preempted_not_resumed") == []


def test_preempted_then_aborted_and_id_reused(tmp_path):
    """Near miss: a is preempted at step 2, aborted while it waits and freed at step 3; its id
    comes back as a new request at step 4, which the worker adds afresh."""
    write(tmp_path, 6,
          requests=[intro(0, "a"), intro(4, "a")],
          scheduled=[new(0, "a", [0]), cached(1, "a", 4, [1]),
                     new(4, "a", [2]), cached(5, "a", 4, [3])],
          preempted=[freed(2, "a")],
          finish_events=[event(2, "a", reason="FINISHED_ABORTED", source="finish_requests")],
          finished=[freed(3, "a")], waiting={2: 1})
    assert tt.found(tmp_path, "lifecycle.preempted_not_resumed") == []


# --- lifecycle.resumed_without_preemption ----------------------------------------------------

def test_resumed_without_any_preemption(tmp_path):
    """a decodes at steps 1 and 2, then comes back as resumed at step 3 though it was never
    preempted: the worker throws away the KV it computed."""
    write(tmp_path, 4,
          requests=[intro(0, "a")],
          scheduled=[new(0, "a", [0]), cached(1, "a", 4, [1]), cached(2, "a", 5),
                     resumed(3, "a", 3, [2, 3])])
    assert tt.found(tmp_path, "lifecycle.resumed_without_preemption") == [
        (3, "a", "resumed; last ran at step 2, no preemption since")]


def test_resumed_after_a_stale_preemption(tmp_path):
    """Preempted at step 1 and resumed at step 2 (fine), then resumed again at step 4 with no
    preemption since it ran at step 3: an earlier preemption does not count."""
    write(tmp_path, 5,
          requests=[intro(0, "a")],
          scheduled=[new(0, "a", [0]), resumed(2, "a", 1, [1, 2]), cached(3, "a", 5),
                     resumed(4, "a", 3, [3, 4])],
          preempted=[freed(1, "a")], waiting={1: 1})
    assert tt.found(tmp_path, "lifecycle.resumed_without_preemption") == [
        (4, "a", "resumed; last ran at step 3, no preemption since")]


def test_resumed_after_each_preemption(tmp_path):
    """Two rounds of preemption and resumption, each resumption after a preemption that came
    after the request last ran: what vLLM does under KV pressure."""
    write(tmp_path, 7,
          requests=[intro(0, "a")],
          scheduled=[new(0, "a", [0]), cached(1, "a", 4, [1]),
                     resumed(3, "a", 2, [2, 3]), cached(4, "a", 6),
                     resumed(6, "a", 4, [4, 5])],
          preempted=[freed(2, "a"), freed(5, "a")], waiting={2: 1, 5: 1})
    assert tt.found(tmp_path, "lifecycle.resumed_without_preemption") == []


def test_resumed_first_in_a_trace_attached_mid_stream(tmp_path):
    """Attached to a running engine: a was preempted before the recording began and waits at
    step 0, then is resumed at step 1. The trace cannot show its preemption, so it cannot
    say a resumption came without one (lifecycle.unknown_cached spares such ids the same way)."""
    write(tmp_path, 3,
          requests=[],
          scheduled=[cached(0, "b", 8),
                     cached(1, "b", 9), resumed(1, "a", 2, [4, 5], pos=1),
                     cached(2, "b", 10), cached(2, "a", 6, pos=1)],
          waiting={0: 1}, attached_mid_stream=True)
    assert tt.found(tmp_path, "lifecycle.resumed_without_preemption") == []


# --- lifecycle.scheduled_after_finish --------------------------------------------------------

def test_scheduled_after_finish_plain_id(tmp_path):
    """a finishes at step 1, is freed at step 2, yet stays listed through step 3 (so it is a
    plain id, read without the window). Step 3 is a KeyError in the worker; step 2 (freed and
    listed in one step) is finished.and_scheduled's, not this check's."""
    write(tmp_path, 4,
          requests=[intro(0, "a")],
          scheduled=[new(0, "a", [0]), cached(1, "a", 4, [1]), cached(2, "a", 5),
                     cached(3, "a", 6)],
          finish_events=[event(1, "a")], finished=[freed(2, "a")])
    assert plain(tmp_path, "a")
    assert tt.found(tmp_path, "lifecycle.scheduled_after_finish") == [
        (3, "a", "freed by finished_req_ids at step 2, introduced at step 0")]


def test_scheduled_after_finish_after_a_gap(tmp_path):
    """a is freed at step 2 and listed as cached again at step 4, after two steps without it
    (an id with a gap goes through the window)."""
    write(tmp_path, 5,
          requests=[intro(0, "a")],
          scheduled=[new(0, "a", [0]), cached(1, "a", 4, [1]), cached(4, "a", 5)],
          finish_events=[event(1, "a")], finished=[freed(2, "a")])
    assert not plain(tmp_path, "a")
    assert tt.found(tmp_path, "lifecycle.scheduled_after_finish") == [
        (4, "a", "freed by finished_req_ids at step 2, introduced at step 0")]


def test_scheduled_after_finish_not_for_a_reused_id(tmp_path):
    """a is freed at step 2 and its id introduced again in that very step: the cached rows
    after it are the new instance's. b ends plainly (freed, never listed again)."""
    write(tmp_path, 4,
          requests=[intro(0, "a"), intro(0, "b", pos=1), intro(2, "a")],
          scheduled=[new(0, "a", [0]), new(0, "b", [1], pos=1),
                     cached(1, "a", 4, [2]), cached(1, "b", 4, [3], pos=1),
                     new(2, "a", [4]), cached(3, "a", 4, [5])],
          finish_events=[event(1, "a"), event(1, "b")],
          finished=[freed(2, "a"), freed(2, "b")])
    assert tt.found(tmp_path, "lifecycle.scheduled_after_finish") == []


# --- lifecycle.unknown_cached ----------------------------------------------------------------

def _strangers(tmp_path, **manifest) -> None:
    """a is introduced; b (listed every step, so plain) and c (with a gap, so windowed) are
    scheduled as cached without ever being introduced."""
    write(tmp_path, 4,
          requests=[intro(0, "a")],
          scheduled=[new(0, "a", [0]),
                     cached(1, "a", 4, [1]), cached(1, "b", 4, pos=1), cached(1, "c", 4, pos=2),
                     cached(2, "a", 5), cached(2, "b", 5, pos=1),
                     cached(3, "a", 6), cached(3, "c", 5, pos=1)],
          **manifest)


def test_unknown_cached_never_introduced(tmp_path):
    """Cached rows of ids the worker never saw in scheduled_new_reqs: each is a KeyError in the
    model runner. Every such row is reported."""
    _strangers(tmp_path)
    msg = "scheduled as cached but never introduced in scheduled_new_reqs"
    assert tt.found(tmp_path, "lifecycle.unknown_cached") == [
        (1, "b", msg), (1, "c", msg), (2, "b", msg), (3, "c", msg)]


def test_unknown_cached_not_when_attached_mid_stream(tmp_path):
    """The same rows in a trace that attached to a running engine: b and c were introduced
    before the recording began."""
    _strangers(tmp_path, attached_mid_stream=True)
    assert tt.found(tmp_path, "lifecycle.unknown_cached") == []


def test_unknown_cached_attached_but_freed_before(tmp_path):
    """Attached mid-stream, b (introduced before the recording) finishes and is freed at step
    1, then is scheduled as cached again at step 2: the worker has dropped it by then. Its row
    at step 0 is not blamed."""
    write(tmp_path, 3,
          requests=[],
          scheduled=[cached(0, "b", 8), cached(2, "b", 9)],
          finish_events=[event(0, "b")], finished=[freed(1, "b")],
          attached_mid_stream=True)
    assert tt.found(tmp_path, "lifecycle.unknown_cached") == [
        (2, "b", "scheduled as cached but never introduced in scheduled_new_reqs")]
