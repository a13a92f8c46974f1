"""Diff tests of the checks on the outputs the worker keeps for a cached request
(docs/worker-reads.md, items 1 and 7): the all_token_ids an async worker rebuilds them from, and a
num_output_tokens below the outputs a sync worker holds, pinned to exact rows of tiny hand-built
traces (tinytrace)."""

from __future__ import annotations

import tinytrace as tt

ASYNC = {"async_scheduling": True}
PROMPT = [11, 12, 13, 14]


def tok(step: int) -> int:
    """The look-alike model's token sampled at `step`."""
    return 100 + step


def out(step: int, rid: str = "a", toks: list[int] | None = None) -> dict:
    return {"step": step, "req_id": rid, "pos": 0,
            "sampled_token_ids": [tok(step)] if toks is None else toks}


def write(tmp_path, scheduled: list[dict], model_outputs: list[dict], preempted=(),
          redacted=(), settings=None, rids=("a",)) -> None:
    """Steps 0..the last listed one; each request of `rids` introduced at step 0 with PROMPT."""
    n = max(r["step"] for r in scheduled) + 1
    tt.write(tmp_path, {"steps": tt.steps(n),
                        "requests": [{**tt.intro(0, rid, len(PROMPT), pos=i),
                                      "prompt_token_ids": PROMPT} for i, rid in enumerate(rids)],
                        "scheduled": scheduled, "model_outputs": model_outputs,
                        "preempted": [{"step": s, "req_id": r} for s, r in preempted],
                        "redacted": list(redacted)},
             settings=settings)


def preempted_and_back(all_token_ids: list[int] | None, back: str = "resumed") -> list[dict]:
    """a prefills at 0 (sampling a token), decodes at 1 (a second), is preempted at 2 and comes
    back at 3 with its 2 outputs and `all_token_ids`: resumed (recomputing prompt and outputs), or
    with back='cached' a row that simply was not scheduled at step 2."""
    row = (tt.resumed(3, "a", 0, 6, [2, 3]) if back == "resumed"
           else tt.cached(3, "a", 5, 1, None))
    return [tt.new(0, "a", 0, 4, [0]),
            tt.cached(1, "a", 4, 1, [1], num_output_tokens=1),
            {**row, "num_output_tokens": 2, "all_token_ids": all_token_ids}]


OUTPUTS = [out(0), out(1)]
SENT = PROMPT + [tok(0), tok(1)]


# --- outputs.all_token_ids_missing --------------------------------------------------------------

def test_resumed_without_all_token_ids(tmp_path):
    """Async: a comes back after its preemption with 2 outputs and no all_token_ids: the worker's
    all_token_ids["a"] raises KeyError."""
    write(tmp_path, preempted_and_back(None), OUTPUTS, preempted=[(2, "a")], settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == [
        (3, "a", "resumed with num_output_tokens 2: no all_token_ids (KeyError in the worker)")]


def test_resumed_with_all_token_ids(tmp_path):
    """The same row with prompt and outputs sent."""
    write(tmp_path, preempted_and_back(SENT), OUTPUTS, preempted=[(2, "a")], settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == []


def test_resumed_without_all_token_ids_on_a_sync_engine(tmp_path):
    """Sync: the worker kept a's outputs through the preemption and never reads the field."""
    write(tmp_path, preempted_and_back(None), OUTPUTS, preempted=[(2, "a")])
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == []


def test_resumed_with_all_token_ids_redacted(tmp_path):
    """Prompts redacted: the list is a `redacted` row of its length, and it was sent."""
    red = [{"step": 3, "req_id": "a", "field": "all_token_ids", "length": 6, "sha256": "00"}]
    write(tmp_path, preempted_and_back(None), OUTPUTS, preempted=[(2, "a")], redacted=red,
          settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == []


def test_all_token_ids_shorter_than_the_outputs(tmp_path):
    """One token sent for 2 outputs, and a redacted one of 1: the worker would take the one as
    all the outputs."""
    write(tmp_path, preempted_and_back([tok(1)]), OUTPUTS, preempted=[(2, "a")], settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == [
        (3, "a", "resumed with num_output_tokens 2: all_token_ids holds 1 tokens")]
    red = [{"step": 3, "req_id": "a", "field": "all_token_ids", "length": 1, "sha256": "00"}]
    write(tmp_path / "r", preempted_and_back(None), OUTPUTS, preempted=[(2, "a")], redacted=red,
          settings=ASYNC)
    assert tt.found(tmp_path / "r", "outputs.all_token_ids_missing") == [
        (3, "a", "resumed with num_output_tokens 2: all_token_ids holds 1 tokens")]


def resumed_b(step: int) -> list[dict]:
    """b, a second request, preempted after its first output and resumed at `step` with it."""
    return [tt.new(0, "b", 0, 4, [4], pos=1),
            {**tt.resumed(step, "b", 0, 5, [5, 6], pos=1), "num_output_tokens": 1,
             "all_token_ids": PROMPT + [tok(0)]}]


def test_cached_after_a_step_without_tokens(tmp_path):
    """a is not scheduled at step 2 and comes back cached at 3: it left the worker's batch, so the
    worker reads the field, and none came (b's resumed row shows the engine's runner is v1)."""
    write(tmp_path, preempted_and_back(None, back="cached") + resumed_b(2),
          OUTPUTS + [out(0, "b")], preempted=[(1, "b")], settings=ASYNC, rids=("a", "b"))
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == [
        (3, "a", "cached, no token count at step 2 with num_output_tokens 2: "
                 "no all_token_ids (KeyError in the worker)")]


def test_cached_after_a_step_listed_without_tokens(tmp_path):
    """a is listed at step 2 without a token count: the worker takes it out of the batch there
    all the same."""
    rows = preempted_and_back(None, back="cached") + [
        {**tt.cached(2, "a", 5, 0), "num_scheduled_tokens": None, "num_output_tokens": 2}]
    write(tmp_path, rows + resumed_b(2), OUTPUTS + [out(0, "b")], preempted=[(1, "b")],
          settings=ASYNC, rids=("a", "b"))
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == [
        (3, "a", "cached, no token count at step 2 with num_output_tokens 2: "
                 "no all_token_ids (KeyError in the worker)")]


def test_cached_after_a_step_without_tokens_on_model_runner_v2(tmp_path):
    """The same gap with no row anywhere carrying the field and nothing resumed: what vLLM's
    model runner V2 records (it reads none), so the engine is not checked."""
    write(tmp_path, preempted_and_back(None, back="cached"), OUTPUTS, settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == []


def test_cached_in_consecutive_steps_needs_none(tmp_path):
    """a decodes at 1, 2 and 3: it stays in the batch, and no all_token_ids is due."""
    rows = [tt.new(0, "a", 0, 4, [0])] + [
        tt.cached(s, "a", 3 + s, 1, None, num_output_tokens=s) for s in (1, 2, 3)]
    write(tmp_path, rows + resumed_b(2), [out(0), out(1), out(2), out(0, "b")],
          preempted=[(1, "b")], settings=ASYNC, rids=("a", "b"))
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == []


# --- outputs.all_token_ids_mismatch -------------------------------------------------------------

def test_all_token_ids_ending_in_the_outputs(tmp_path):
    write(tmp_path, preempted_and_back(SENT), OUTPUTS, preempted=[(2, "a")], settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_mismatch") == []


def test_all_token_ids_ending_in_other_tokens(tmp_path):
    """The list as it was before a's last output: its last 2 entries are a prompt token and the
    first output, and both differ from the outputs in their places."""
    write(tmp_path, preempted_and_back(SENT[:-1]), OUTPUTS, preempted=[(2, "a")], settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_mismatch") == [
        (3, "a", "2 of the last 2 all_token_ids differ from the tokens the request sampled")]


def test_all_token_ids_one_token_changed(tmp_path):
    """A gap row, its last token another: one place differs."""
    write(tmp_path, preempted_and_back(SENT[:-1] + [7], back="cached"), OUTPUTS,
          settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_mismatch") == [
        (3, "a", "1 of the last 2 all_token_ids differ from the tokens the request sampled")]


def test_all_token_ids_after_output_the_scheduler_dropped(tmp_path):
    """Three tokens sampled before step 3, and the scheduler counts 2 (a reset_prefix_cache
    dropped the output in flight): not compared."""
    rows = preempted_and_back(SENT[:-1] + [7])
    write(tmp_path, rows, OUTPUTS + [out(2)], preempted=[(2, "a")], settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_mismatch") == []


def test_all_token_ids_with_drafts_accepted(tmp_path):
    """Two tokens in one step's output (a draft accepted), in order: they match in place; the
    other order does not."""
    rows = [tt.new(0, "a", 0, 4, [0]),
            {**tt.resumed(3, "a", 0, 6, [2, 3]), "num_output_tokens": 2, "all_token_ids": SENT}]
    write(tmp_path, rows, [out(0, toks=[tok(0), tok(1)])], preempted=[(2, "a")], settings=ASYNC)
    assert tt.found(tmp_path, "outputs.all_token_ids_mismatch") == []
    write(tmp_path / "swapped", rows, [out(0, toks=[tok(1), tok(0)])], preempted=[(2, "a")],
          settings=ASYNC)
    assert tt.found(tmp_path / "swapped", "outputs.all_token_ids_mismatch") == [
        (3, "a", "2 of the last 2 all_token_ids differ from the tokens the request sampled")]


def test_all_token_ids_other_tokens_on_a_sync_engine(tmp_path):
    write(tmp_path, preempted_and_back(SENT[:-1]), OUTPUTS, preempted=[(2, "a")])
    assert tt.found(tmp_path, "outputs.all_token_ids_mismatch") == []


# --- outputs.count_below_held -------------------------------------------------------------------

def decoding(counts: dict[int, int], last: int = 5) -> list[dict]:
    """a prefills at 0 and decodes a token a step through `last`; num_output_tokens of step s is
    s, or counts[s]."""
    return [tt.new(0, "a", 0, 4, [0])] + [
        tt.cached(s, "a", 3 + s, 1, None, num_output_tokens=counts.get(s, s))
        for s in range(1, last + 1)]


DECODED = [out(s) for s in range(5)]


def test_count_one_short_while_decoding(tmp_path):
    """Step 3 says 2 outputs; the worker holds 3 (steps 0-2): it truncates there. Step 4's count
    is right, and more than the 2 + 1 the worker then holds."""
    write(tmp_path, decoding({3: 2}), DECODED)
    assert tt.found(tmp_path, "outputs.count_below_held") == [
        (3, "a", "cached: num_output_tokens 2 < 3 outputs the worker holds "
                 "(sampled before this step)")]


def test_count_right_while_decoding(tmp_path):
    write(tmp_path, decoding({}), DECODED)
    assert tt.found(tmp_path, "outputs.count_below_held") == []


def test_count_short_again_after_a_truncation(tmp_path):
    """Step 3 truncates the worker's outputs to 2; step 4 says 2 again, where the worker holds the
    2 and the one sampled at step 3."""
    write(tmp_path, decoding({3: 2, 4: 2}), DECODED)
    assert tt.found(tmp_path, "outputs.count_below_held") == [
        (3, "a", "cached: num_output_tokens 2 < 3 outputs the worker holds "
                 "(sampled before this step)"),
        (4, "a", "cached: num_output_tokens 2 < 3 outputs the worker holds "
                 "(2 at step 3 + 1 sampled since)")]


def test_count_short_on_an_async_engine(tmp_path):
    """Async: the count includes placeholders and the truncation is the worker's own correction."""
    write(tmp_path, decoding({3: 2}), DECODED, settings=ASYNC)
    assert tt.found(tmp_path, "outputs.count_below_held") == []


def recomputing(count: int) -> list[dict]:
    """a decodes 3 tokens (steps 0-2), is preempted at 3 and resumed at 4, recomputing its 4 + 3
    tokens in two chunks (4, then 3): prompt + outputs are more than either chunk reaches."""
    return [tt.new(0, "a", 0, 4, [0]),
            tt.cached(1, "a", 4, 1, [1], num_output_tokens=1),
            tt.cached(2, "a", 5, 1, None, num_output_tokens=2),
            {**tt.resumed(4, "a", 0, 4, [2]), "num_output_tokens": count},
            tt.cached(5, "a", 4, 3, [3], num_output_tokens=3)]


def test_count_short_while_recomputing(tmp_path):
    """The resumed row says 2 of a's 3 outputs: computed + scheduled (4) stays within prompt +
    outputs, so no other check sees it, and the sync worker truncates the outputs it kept."""
    write(tmp_path, recomputing(2), [out(0), out(1), out(2), out(4, toks=[]), out(5)],
          preempted=[(3, "a")])
    assert tt.found(tmp_path, "outputs.count_below_held") == [
        (4, "a", "resumed: num_output_tokens 2 < 3 outputs the worker holds "
                 "(sampled before this step)")]


def test_count_right_while_recomputing(tmp_path):
    write(tmp_path, recomputing(3), [out(0), out(1), out(2), out(4, toks=[]), out(5)],
          preempted=[(3, "a")])
    assert tt.found(tmp_path, "outputs.count_below_held") == []


def test_count_short_resumed_on_a_pipeline_parallel_engine(tmp_path):
    """Pipeline parallel: a reset_prefix_cache may have dropped the output in flight."""
    write(tmp_path, recomputing(2), [out(0), out(1), out(2), out(4, toks=[]), out(5)],
          preempted=[(3, "a")], settings={"parallel": {"pipeline_parallel_size": 2}})
    assert tt.found(tmp_path, "outputs.count_below_held") == []


def test_count_short_after_a_rollback(tmp_path):
    """Step 3 starts 3 tokens below step 2's end, with no drafts and no preemption: a KV-load
    failure's truncation, whose step's sampled token the scheduler discarded."""
    rows = decoding({3: 2}, last=3)
    rows[3] = {**rows[3], "num_computed_tokens": 3, "num_scheduled_tokens": 3}
    write(tmp_path, rows, DECODED[:4])
    assert tt.found(tmp_path, "outputs.count_below_held") == []
