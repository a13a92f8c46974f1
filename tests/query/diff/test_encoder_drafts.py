"""Diff tests of encoder.freed_while_needed's reads by the drafter (docs/worker-reads.md,
"the draft window shift for MTP").

An eagle-style drafter gathers the encoder outputs again after the target, for the window
[nc' + 1, nc' + 1 + count). Under async scheduling nc' is the num_computed_tokens the scheduler
sent (which counts the previous step's drafts as accepted) less the drafts that step's output
rejected: the worker corrects it after the target's gather and before the drafter's. With 2 or
more rejected, the drafter's window starts behind the target's.

Request a has an 8-token prompt, is prefilled in step 0 (computing its image there), then
decodes with 2 draft placeholders a step (async: -1s), from the num_computed_tokens the async
scheduler sends (the previous row's end, less the drafts rejected two steps back). Step 1's
output accepts no draft: the worker lowers step 2's num_computed_tokens from 11 to 9, and the
drafter reads tokens 10..12. LOOK-ALIKE: the image's placeholder (tokens 9..10) lies past the
prompt. A placeholder inside the prompt cannot be reached this way: the corrected count is
what the request really has computed, at least its prompt, and the window starts after it."""

from __future__ import annotations

import pytest

import tinytrace as tt

ASYNC_EAGLE = {"async_scheduling": True,
               "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
DRAFTS = [-1, -1]


def image(offset=9, length=2):
    return {"step": 0, "req_id": "a", "pos": 0, "identifier": "img-a", "mm_hash": "proc-img-a",
            "modality": "image", "offset": offset, "length": length}


def write(tmp_path, freed_at, settings=ASYNC_EAGLE, step1_output=(6,), img=None, rows=None):
    """a's rows (by default steps 0..3 as in the module's docstring), its model outputs, and
    img-a freed at `freed_at`."""
    if rows is None:
        rows = [tt.cached(1, "a", 8, 3, [2], spec_token_ids=DRAFTS),
                tt.cached(2, "a", 11, 3, [3], spec_token_ids=DRAFTS),
                tt.cached(3, "a", 12, 3, spec_token_ids=DRAFTS)]
    scheduled = [dict(tt.new(0, "a", 0, 8, [0, 1]), encoder_inputs=[0])] + rows
    outputs = {0: [5], 1: list(step1_output), 2: [7, 8], 3: [9]}
    listed = {r["step"] for r in scheduled}
    n = 5

    def total(i):
        return sum(r["num_scheduled_tokens"] for r in scheduled if r["step"] == i)

    tt.write(tmp_path, {
        "steps": tt.steps(n, total_num_scheduled_tokens=total),
        "scheduled": scheduled,
        "requests": [tt.intro(0, "a", 8)],
        "mm_inputs": [img or image()],
        "model_outputs": [{"step": s, "req_id": "a", "pos": 0, "sampled_token_ids": t}
                          for s, t in outputs.items() if s in listed],
        "freed_mm": [{"step": freed_at, "pos": 0, "mm_hash": "img-a"}],
    }, settings=settings)


def test_freed_while_the_drafter_reads_behind_the_target(tmp_path):
    """Step 2's target window (tokens 11..13) is past the image, but the drafter's, after the
    worker took back step 1's 2 rejected drafts, starts at token 10, the image's last: freeing
    it at step 2 is an encoder cache miss in the drafter."""
    write(tmp_path, freed_at=2)
    assert tt.found(tmp_path, "encoder.freed_while_needed") == [
        (2, "a", "reads (the drafter, after 2 rejected drafts) img-a, freed at step 2")]


def test_freed_before_both_reads(tmp_path):
    """Freed at step 1: step 1's chunk reads it (tokens 8..10), and so does step 2's drafter."""
    write(tmp_path, freed_at=1)
    assert tt.found(tmp_path, "encoder.freed_while_needed") == [
        (1, "a", "reads (a chunk over its placeholder) img-a, freed at step 1"),
        (2, "a", "reads (the drafter, after 2 rejected drafts) img-a, freed at step 1")]


@pytest.mark.parametrize("method", ["eagle3", "mtp", "dflash", "draft_model"])
def test_other_drafters_that_take_embeddings(tmp_path, method):
    """Every drafter of propose_draft_token_ids' eagle / dflash / draft-model branch gathers
    with shift_computed_tokens=1."""
    write(tmp_path, freed_at=2, settings={
        "async_scheduling": True, "speculative": {"method": method, "num_speculative_tokens": 2}})
    assert tt.found(tmp_path, "encoder.freed_while_needed") == [
        (2, "a", "reads (the drafter, after 2 rejected drafts) img-a, freed at step 2")]


def test_freed_after_the_drafters_read(tmp_path):
    """Near miss: freed at step 3, after the drafter's last read of it (step 2's output accepts
    one of its 2 drafts, so the worker moves step 3 back by 1 only)."""
    write(tmp_path, freed_at=3)
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []


def test_same_trace_on_a_sync_engine(tmp_path):
    """Near miss: without async scheduling the worker makes no correction, and the drafter's
    window (tokens 12..14) is the target's one token on."""
    write(tmp_path, freed_at=2, settings={**ASYNC_EAGLE, "async_scheduling": False})
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []


@pytest.mark.parametrize("method", ["ngram", "ngram_gpu", "suffix", "medusa"])
def test_same_trace_with_a_drafter_without_embeddings(tmp_path, method):
    """Near miss: an ngram (or suffix, medusa) drafter never gathers encoder outputs."""
    write(tmp_path, freed_at=2, settings={
        "async_scheduling": True, "speculative": {"method": method, "num_speculative_tokens": 2}})
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []


def test_one_draft_rejected(tmp_path):
    """Near miss: step 1's output accepts one draft; the drafter's window starts at token 11,
    past the image."""
    write(tmp_path, freed_at=2, step1_output=(6, 7))
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []


def test_row_left_the_batch(tmp_path):
    """Near miss: a is not scheduled in step 2, so the worker drops it from the batch; step 3
    adds it back with its drafts count reset, and makes no correction."""
    write(tmp_path, freed_at=3, rows=[tt.cached(1, "a", 8, 3, [2], spec_token_ids=DRAFTS),
                                      tt.cached(3, "a", 11, 3, [3], spec_token_ids=DRAFTS)])
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []


def _one_token_step(tmp_path, img):
    # step 2 schedules 1 token (no drafts): the drafter's window is token 10 alone, and the
    # worker tolerates a miss of an input that starts at 9 + 1 or later
    write(tmp_path, freed_at=2, img=img,
          rows=[tt.cached(1, "a", 8, 3, [2], spec_token_ids=DRAFTS), tt.cached(2, "a", 11, 1, [3])])


def test_one_token_step_reads_an_input_that_starts_before(tmp_path):
    _one_token_step(tmp_path, image(offset=9, length=2))
    assert tt.found(tmp_path, "encoder.freed_while_needed") == [
        (2, "a", "reads (the drafter, after 2 rejected drafts) img-a, freed at step 2")]


def test_one_token_step_tolerates_an_input_that_starts_at_the_end(tmp_path):
    """Near miss: the image is token 10 alone, which starts at nc' + count: the runner falls
    back to the token's embedding for drafting (gpu_model_runner's look-ahead tolerance)."""
    _one_token_step(tmp_path, image(offset=10, length=1))
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []
