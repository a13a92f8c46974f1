"""Diff tests of the hand-off checks (transport.*): tiny traces of a live engine armed by the
plugin, whose `transport` table records each step's SchedulerOutput leaving the engine
('executed', hand-off number seq) and reaching a worker ('received'), with the exact rows each
check must return.

The traces share one run of five steps: a (prompt 8) is prefilled in step 0, decodes in step 1
and finishes by length in that step's update; step 2 schedules no tokens and only delivers a's
finished id (the zero-token step an engine may be tempted to skip); b (prompt 4) arrives in step
3 and decodes in step 4."""

from __future__ import annotations

import tinytrace as tt

# each step's total_num_scheduled_tokens, also what each end of its hand-off records
TOKENS = {0: 8, 1: 1, 2: 0, 3: 4, 4: 1}


def executed(step, seq):
    return {"step": step, "event": "executed", "seq": seq, "t_ns": step * 1000 + 100,
            "num_scheduled_tokens": TOKENS[step]}


def received(step, seq, worker=0):
    return {"step": step, "event": "received", "worker": worker, "seq": seq,
            "t_ns": step * 1000 + 200, "num_scheduled_tokens": TOKENS[step]}


def write(tmp_path, transport):
    def step(i, new=0, cached=0, finished=0):
        return {"step": i, "total_num_scheduled_tokens": TOKENS[i], "num_new": new,
                "num_cached": cached, "num_finished": finished}
    cols = {"pos": 0, "kind": "cached"}
    tt.write(tmp_path, {
        "steps": [step(0, new=1), step(1, cached=1), step(2, finished=1), step(3, new=1),
                  step(4, cached=1)],
        "requests": [{"step": 0, "req_id": "a", "pos": 0, "prompt_len": 8},
                     {"step": 3, "req_id": "b", "pos": 0, "prompt_len": 4}],
        "scheduled": [
            {**cols, "step": 0, "req_id": "a", "kind": "new", "num_computed_tokens": 0,
             "num_scheduled_tokens": 8},
            {**cols, "step": 1, "req_id": "a", "num_computed_tokens": 8,
             "num_scheduled_tokens": 1, "num_output_tokens": 1},
            {**cols, "step": 3, "req_id": "b", "kind": "new", "num_computed_tokens": 0,
             "num_scheduled_tokens": 4},
            {**cols, "step": 4, "req_id": "b", "num_computed_tokens": 4,
             "num_scheduled_tokens": 1, "num_output_tokens": 1}],
        "finish_events": [{"step": 1, "req_id": "a", "reason": "LENGTH",
                           "source": "update_from_output"}],
        "finished": [{"step": 2, "req_id": "a"}],
        "transport": transport})


def handoffs(*steps):
    """Each of these steps executed, in order (seq 1, 2, ...), and received by worker 0."""
    rows = []
    for seq, s in enumerate(steps, start=1):
        rows += [executed(s, seq), received(s, seq)]
    return rows


# --- transport.not_executed --------------------------------------------------------------------

def test_not_executed_zero_token_step_skipped(tmp_path):
    """The engine never hands step 2 (0 tokens, only a's finished id) to its executor: the
    worker keeps a cached for good. Later steps were executed, so step 2 is not in flight."""
    write(tmp_path, handoffs(0, 1, 3, 4))
    assert tt.found(tmp_path, "transport.not_executed") == [
        (2, None, "never executed: 0 tokens, 0 new, 1 finished ids")]


def test_not_executed_a_new_request_skipped(tmp_path):
    """Step 3, which introduces b, never reaches the executor, though step 4 does."""
    write(tmp_path, handoffs(0, 1, 2, 4))
    assert tt.found(tmp_path, "transport.not_executed") == [
        (3, None, "never executed: 4 tokens, 1 new, 0 finished ids")]


def test_not_executed_every_step_executed(tmp_path):
    """Near miss: the zero-token step handed over like the others."""
    write(tmp_path, handoffs(0, 1, 2, 3, 4))
    assert tt.found(tmp_path, "transport.not_executed") == []


def test_not_executed_last_step_in_flight(tmp_path):
    """Near miss: the trace ends before step 4's hand-off was recorded; the last step may still
    be on its way, and is not reported."""
    write(tmp_path, handoffs(0, 1, 2, 3))
    assert tt.found(tmp_path, "transport.not_executed") == []


# --- transport.not_received --------------------------------------------------------------------

def test_not_received_one_handoff_lost(tmp_path):
    """Every step is executed, but no worker receives hand-off 3 (step 2: a's finished id) while
    it receives hand-off 4: reported at the step of the lost hand-off."""
    rows = [r for r in handoffs(0, 1, 2, 3, 4) if (r["event"], r["seq"]) != ("received", 3)]
    write(tmp_path, rows)
    assert tt.found(tmp_path, "transport.not_received") == [
        (2, None, "hand-off 3 never received by a worker")]


def test_not_received_last_handoff_in_flight(tmp_path):
    """Near miss: only the last hand-off (5, step 4) lacks a receipt: it may still be on its
    way to the worker."""
    rows = [r for r in handoffs(0, 1, 2, 3, 4) if (r["event"], r["seq"]) != ("received", 5)]
    write(tmp_path, rows)
    assert tt.found(tmp_path, "transport.not_received") == []

