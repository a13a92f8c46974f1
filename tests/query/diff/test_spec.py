"""Diff tests of the speculative-decoding checks: draft tokens (scheduled_spec_decode_tokens)
against the request's tokens and outputs, pinned to exact rows of tiny hand-built traces
(tinytrace)."""

from __future__ import annotations

import tinytrace as tt


def intro(step: int, rid: str, prompt_len: int, pos: int = 0) -> dict:
    return {"step": step, "req_id": rid, "pos": pos, "prompt_len": prompt_len}


def new(step: int, rid: str, tokens: int, blocks: list[int], pos: int = 0) -> dict:
    return {"step": step, "req_id": rid, "kind": "new", "pos": pos, "resumed": False,
            "num_scheduled_tokens": tokens, "num_computed_tokens": 0, "new_block_ids": [blocks]}


def cached(step: int, rid: str, computed: int, outputs: int, spec: list[int] | None = None,
           tokens: int | None = None, blocks: list[int] | None = None, pos: int = 0) -> dict:
    """A decode schedules 1 + its drafts unless `tokens` says otherwise."""
    return {"step": step, "req_id": rid, "kind": "cached", "pos": pos, "resumed": False,
            "num_scheduled_tokens": 1 + len(spec or []) if tokens is None else tokens,
            "num_computed_tokens": computed, "num_output_tokens": outputs,
            "new_block_ids": None if blocks is None else [blocks], "spec_token_ids": spec}


def out(step: int, rid: str, sampled: list[int], pos: int = 0) -> dict:
    return {"step": step, "req_id": rid, "pos": pos, "sampled_token_ids": sampled}


def write(tmp_path, requests: list[dict], scheduled: list[dict],
          model_outputs: list[dict] = (), finish_events: list[dict] = (),
          finished: list[dict] = ()) -> None:
    """Steps (and updates) 0..the last listed step, agreeing with the rows."""
    n = max(r["step"] for r in scheduled) + 1

    def listed(i: int) -> list[dict]:
        return [r for r in scheduled if r["step"] == i and r.get("kind")]

    steps = tt.steps(
        n,
        total_num_scheduled_tokens=lambda i: sum(r["num_scheduled_tokens"] for r in listed(i)),
        num_new=lambda i: sum(r["kind"] == "new" for r in listed(i)),
        num_cached=lambda i: sum(r["kind"] == "cached" for r in listed(i)),
        num_finished=lambda i: sum(f["step"] == i for f in finished),
        num_running=lambda i: len(listed(i)), num_waiting=0,
        num_spec_tokens_to_schedule=lambda i: sum(len(r.get("spec_token_ids") or [])
                                                  for r in scheduled if r["step"] == i))
    updates = [{"step": i, "num_outputs": sum(m["step"] == i for m in model_outputs)}
               for i in range(n)] if model_outputs else []
    tt.write(tmp_path, {"steps": steps, "requests": requests, "scheduled": scheduled,
                        "model_outputs": list(model_outputs), "updates": updates,
                        "finish_events": list(finish_events), "finished": list(finished)})


# --- spec.before_any_output ------------------------------------------------------------------

def chunked_prefill(tmp_path, drafts_at_1: list[int]) -> None:
    """a's 8-token prompt prefilled in two chunks of 4: step 0 samples nothing, step 1 samples
    the first token. Drafts come with step 1 (given) and step 2 (after a sampled token)."""
    write(tmp_path,
          requests=[intro(0, "a", 8)],
          scheduled=[new(0, "a", 4, [0]),
                     cached(1, "a", 4, 0, spec=drafts_at_1, tokens=4, blocks=[1]),
                     cached(2, "a", 8, 1, spec=[21, 22], blocks=[2])],
          model_outputs=[out(0, "a", []), out(1, "a", [20]), out(2, "a", [21, 30])])


def test_drafts_before_any_output(tmp_path):
    """Real drafts in the step that samples a's first token: the sample comes after the
    schedule, so nothing existed to draft from. Step 2's drafts follow a sampled token."""
    chunked_prefill(tmp_path, [11, 12])
    assert tt.found(tmp_path, "spec.before_any_output") == [
        (1, "a", "drafts before the first sampled token")]


def test_placeholder_drafts_before_any_output(tmp_path):
    """The same step with -1 placeholders (a newly admitted decode under async scheduling):
    not real drafts."""
    chunked_prefill(tmp_path, [-1, -1])
    assert tt.found(tmp_path, "spec.before_any_output") == []


def test_drafts_before_the_reused_ids_first_output(tmp_path):
    """a decodes with drafts (after its first token), finishes and is freed at step 2, where
    its id is introduced again; the new instance drafts at step 3 before its own first token
    (its step 2 chunk sampled nothing). The first instance's tokens do not count."""
    write(tmp_path,
          requests=[intro(0, "a", 4), intro(2, "a", 8)],
          scheduled=[new(0, "a", 4, [0]),
                     cached(1, "a", 4, 1, spec=[6, 7], blocks=[1]),
                     new(2, "a", 4, [2]),
                     cached(3, "a", 4, 0, spec=[9, 9], tokens=4, blocks=[3])],
          model_outputs=[out(0, "a", [5]), out(1, "a", [6, 7, 8]), out(2, "a", []),
                         out(3, "a", [12])],
          finish_events=[{"step": 1, "req_id": "a", "reason": "LENGTH",
                          "source": "update_from_output", "t_ns": 1500}],
          finished=[{"step": 2, "req_id": "a"}])
    assert tt.found(tmp_path, "spec.before_any_output") == [
        (3, "a", "drafts before the first sampled token")]


# --- spec.too_many ---------------------------------------------------------------------------

def test_too_many_drafts(tmp_path):
    """b schedules 1 token for 3 drafts (step 1) and a 2 tokens for 2 drafts (step 2): a decode
    needs 1 + drafts, else no slot holds the token the drafts extend."""
    write(tmp_path,
          requests=[intro(0, "a", 4), intro(0, "b", 4, pos=1)],
          scheduled=[new(0, "a", 4, [0]), new(0, "b", 4, [1], pos=1),
                     cached(1, "a", 4, 1, spec=[6, 7], blocks=[2]),
                     cached(1, "b", 4, 1, spec=[4, 4, 4], tokens=1, blocks=[3], pos=1),
                     cached(2, "a", 7, 4, spec=[8, 9], tokens=2, blocks=[4]),
                     cached(2, "b", 5, 2, spec=[5, 5, 5], blocks=[5], pos=1)])
    assert tt.found(tmp_path, "spec.too_many") == [
        (1, "b", "3 drafts for 1 scheduled tokens"),
        (2, "a", "2 drafts for 2 scheduled tokens")]


def test_drafts_with_one_token_more(tmp_path):
    """The same drafts, each decode scheduling 1 + its drafts."""
    write(tmp_path,
          requests=[intro(0, "a", 4), intro(0, "b", 4, pos=1)],
          scheduled=[new(0, "a", 4, [0]), new(0, "b", 4, [1], pos=1),
                     cached(1, "a", 4, 1, spec=[6, 7], blocks=[2]),
                     cached(1, "b", 4, 1, spec=[4, 4, 4], blocks=[3], pos=1),
                     cached(2, "a", 7, 4, spec=[8, 9], blocks=[4]),
                     cached(2, "b", 8, 5, spec=[5, 5, 5], blocks=[5], pos=1)])
    assert tt.found(tmp_path, "spec.too_many") == []


# --- spec.unscheduled ------------------------------------------------------------------------

def two_drafting(step_2_b: list[dict]) -> dict:
    """a and b decode with one draft each at step 1; at step 2 a goes on and b's rows are
    given."""
    return {"requests": [intro(0, "a", 4), intro(0, "b", 4, pos=1)],
            "scheduled": [new(0, "a", 4, [0]), new(0, "b", 4, [1], pos=1),
                          cached(1, "a", 4, 1, spec=[6], blocks=[2]),
                          cached(1, "b", 4, 1, spec=[7], blocks=[3], pos=1),
                          cached(2, "a", 6, 3, spec=[8])] + step_2_b}


def test_drafts_for_an_unscheduled_request(tmp_path):
    """b is left out of step 2 but its drafts are still in scheduled_spec_decode_tokens (its
    only row, without a kind or tokens): the worker has no place for them."""
    b = {"step": 2, "req_id": "b", "spec_token_ids": [9, 10]}
    write(tmp_path, **two_drafting([b]))
    assert tt.found(tmp_path, "spec.unscheduled") == [
        (2, "b", "2 draft tokens, no tokens scheduled")]


def test_unscheduled_request_keeps_its_drafts_to_itself(tmp_path):
    """b is left out of step 2 entirely (the scheduler keeps its drafts for a later step)."""
    write(tmp_path, **two_drafting([]))
    assert tt.found(tmp_path, "spec.unscheduled") == []
