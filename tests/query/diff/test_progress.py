"""Diff tests of the progress checks: an engine that spins with work queued or running, and a
running request the scheduler leaves out, pinned to exact rows of tiny hand-built traces
(tinytrace). progress.stalled and progress.stuck_running read `steps` alone, so their traces
are steps rows only."""

from __future__ import annotations

import pytest

import tinytrace as tt

PROMPT = 4  # a's prompt: one block of the look-alike's block_size 4

# --- progress.stalled ------------------------------------------------------------------------

# A step as `steps` shows it: (total_num_scheduled_tokens, num_running, num_waiting).
STEP_KINDS = {
    "r": (1, 1, 1),  # a request decodes, another waits
    "s": (0, 0, 1),  # stalled: nothing scheduled, nothing running, a request waiting
    "z": (0, 1, 1),  # nothing scheduled, but a request runs (e.g. its KV still loading)
    "i": (0, 0, 0),  # nothing scheduled, nothing queued: idle
    "y": (0, 1, 0),  # nothing scheduled, a request runs, none waits
}


def spin(tmp_path, pattern: str) -> None:
    """One steps row per letter of `pattern` (see STEP_KINDS), from step 0."""
    tt.write(tmp_path, {"steps": tt.steps(
        len(pattern),
        total_num_scheduled_tokens=lambda i: STEP_KINDS[pattern[i]][0],
        num_running=lambda i: STEP_KINDS[pattern[i]][1],
        num_waiting=lambda i: STEP_KINDS[pattern[i]][2])})


def test_stalled_runs_of_eight_and_ten(tmp_path):
    """Two runs of zero-token steps with work waiting and nothing running: 8 steps from step 1
    (the shortest reported, at its 8th step, 8) and 10 from step 10 (at its 8th, 17)."""
    spin(tmp_path, "r" + "s" * 8 + "r" + "s" * 10)
    assert tt.found(tmp_path, "progress.stalled") == [
        (8, None, "8 consecutive zero-token steps from step 1 with requests waiting and none "
                  "running"),
        (17, None, "10 consecutive zero-token steps from step 10 with requests waiting and none "
                   "running")]


@pytest.mark.parametrize("pattern", [
    "r" + "s" * 7 + "r",              # seven: a grammar still compiling can cause a few
    "r" + "s" * 4 + "z" + "s" * 4,    # a running request splits the run in two of four
    "r" + "z" * 8,                    # a request runs (holds KV) through zero-token steps
    "r" + "i" * 8,                    # nothing waits: the engine is idle, not stalled
], ids=["seven", "split", "running", "idle"])
def test_stalled_not_reported(tmp_path, pattern):
    """Zero-token steps that are not eight in a row with work waiting and nothing running."""
    spin(tmp_path, pattern)
    assert tt.found(tmp_path, "progress.stalled") == []


# --- progress.stuck_running ------------------------------------------------------------------

def test_stuck_running_runs_of_32_and_40(tmp_path):
    """Two runs of zero-token steps while a request is running: 32 from step 1 (the shortest
    reported, at its 32nd step, 32), with a request waiting too, and 40 from step 34 with none
    waiting (at its 32nd, 65)."""
    spin(tmp_path, "r" + "z" * 32 + "r" + "y" * 40)
    assert tt.found(tmp_path, "progress.stuck_running") == [
        (32, None, "32 consecutive zero-token steps from step 1 with requests running"),
        (65, None, "40 consecutive zero-token steps from step 34 with requests running")]


@pytest.mark.parametrize("pattern", [
    "r" + "z" * 31 + "r",             # 31: longer than any batch queue empties, still allowed
    "r" + "y" * 16 + "s" + "y" * 16,  # a step with none running splits the run
    "r" + "s" * 40,                   # nothing runs: progress.stalled's case
    "r" + "i" * 40,                   # nothing queued: idle
], ids=["thirty-one", "split", "none-running", "idle"])
def test_stuck_running_not_reported(tmp_path, pattern):
    """Zero-token steps that are not 32 in a row with a request running."""
    spin(tmp_path, pattern)
    assert tt.found(tmp_path, "progress.stuck_running") == []


# --- progress.starved ------------------------------------------------------------------------

def starved(tmp_path, back_at: int, others: dict[int, list[tuple[str, int]]] | None = None,
            preempt_at: int | None = None) -> None:
    """a prefills at step 0, decodes at step 1 and is next scheduled at step `back_at` (cached,
    or resumed if preempted at `preempt_at` meanwhile); every step between is empty but for
    `others`: {step: [(req_id, prompt_len), ...]}, requests prefilled whole in that step that
    finish with their first token (freed the next step)."""
    others = others or {}
    requests = [{"step": 0, "req_id": "a", "pos": 0, "prompt_len": PROMPT}]
    scheduled = [
        {"step": 0, "req_id": "a", "kind": "new", "pos": 0, "resumed": False,
         "num_scheduled_tokens": PROMPT, "num_computed_tokens": 0, "new_block_ids": [[0]]},
        {"step": 1, "req_id": "a", "kind": "cached", "pos": 0, "resumed": False,
         "num_scheduled_tokens": 1, "num_computed_tokens": 4, "num_output_tokens": 1,
         "new_block_ids": [[1]]}]
    if preempt_at is None:
        scheduled.append({"step": back_at, "req_id": "a", "kind": "cached", "pos": 0,
                          "resumed": False, "num_scheduled_tokens": 1, "num_computed_tokens": 5,
                          "num_output_tokens": 2, "new_block_ids": None})
    else:  # its prompt and two outputs recomputed into a new table
        scheduled.append({"step": back_at, "req_id": "a", "kind": "resumed", "pos": 0,
                          "resumed": True, "num_scheduled_tokens": 6, "num_computed_tokens": 0,
                          "num_output_tokens": 2, "new_block_ids": [[0, 1]]})
    finish_events, finished = [], []
    block = 2  # a holds 0 and 1
    for step, reqs in others.items():
        for pos, (rid, prompt_len) in enumerate(reqs):
            n_blocks = -(-prompt_len // 4)
            requests.append({"step": step, "req_id": rid, "pos": pos, "prompt_len": prompt_len})
            scheduled.append({"step": step, "req_id": rid, "kind": "new", "pos": pos,
                              "resumed": False, "num_scheduled_tokens": prompt_len,
                              "num_computed_tokens": 0,
                              "new_block_ids": [list(range(block, block + n_blocks))]})
            block += n_blocks
            finish_events.append({"step": step, "req_id": rid, "reason": "LENGTH",
                                  "source": "update_from_output", "t_ns": step * 1000 + 500})
            finished.append({"step": step + 1, "req_id": rid})

    def listed(i: int) -> list[dict]:
        return [r for r in scheduled if r["step"] == i]

    def waiting(i: int) -> int:
        return 1 if preempt_at is not None and preempt_at <= i < back_at else 0

    steps = tt.steps(
        back_at + 1,
        total_num_scheduled_tokens=lambda i: sum(r["num_scheduled_tokens"] for r in listed(i)),
        num_new=lambda i: sum(r["kind"] == "new" for r in listed(i)),
        num_cached=lambda i: sum(r["kind"] != "new" for r in listed(i)),
        num_finished=lambda i: sum(f["step"] == i for f in finished),
        # a is running (though forgotten) until it is preempted
        num_running=lambda i: 1 - waiting(i) + sum(r["req_id"] != "a" for r in listed(i)),
        num_waiting=waiting)
    preempted = [] if preempt_at is None else [{"step": preempt_at, "req_id": "a"}]
    tt.write(tmp_path, {"steps": steps, "requests": requests, "scheduled": scheduled,
                        "finish_events": finish_events, "finished": finished,
                        "preempted": preempted})


def test_starved_for_64_steps_with_room(tmp_path):
    """A running request left out from step 1 to step 65 (64 steps apart, the least reported)
    while every step between scheduled nothing: the scheduler forgot it."""
    starved(tmp_path, back_at=65)
    assert tt.found(tmp_path, "progress.starved") == [
        (65, "a", "not scheduled from step 1 to 65 with budget to spare")]


def test_starved_not_for_63_steps(tmp_path):
    """The same request back one step sooner (63 steps apart): a wait the check allows."""
    starved(tmp_path, back_at=64)
    assert tt.found(tmp_path, "progress.starved") == []


@pytest.mark.parametrize("others", [
    {30: [("b", 32)]},                                        # 32 tokens: the token budget
    {30: [("b", 4), ("c", 4), ("d", 4), ("e", 4)]},           # 4 requests: the sequence slots
], ids=["tokens", "seqs"])
def test_starved_not_when_a_step_was_full(tmp_path, others):
    """The same 64-step gap, but one step in it used the whole token budget or every sequence
    slot (max_num_batched_tokens 32, max_num_seqs 4): a had no room then, so its wait is not
    the scheduler forgetting it."""
    starved(tmp_path, back_at=65, others=others)
    assert tt.found(tmp_path, "progress.starved") == []


def test_starved_but_a_step_almost_full(tmp_path):
    """The same 64-step gap with one step of 31 tokens and three requests, one short of each
    limit: still room for a."""
    starved(tmp_path, back_at=65, others={30: [("b", 23), ("c", 4), ("d", 4)]})
    assert tt.found(tmp_path, "progress.starved") == [
        (65, "a", "not scheduled from step 1 to 65 with budget to spare")]


def test_starved_not_when_preempted(tmp_path):
    """a preempted at step 10 and resumed at step 65: a preempted request waits for KV blocks,
    not for budget, and is no longer running."""
    starved(tmp_path, back_at=65, preempt_at=10)
    assert tt.found(tmp_path, "progress.starved") == []
