"""Diff tests of the catalog's exact edges: for each bound a check enforces, the value at the
worker's own limit and its neighbours, where the other diff tests do not already pin them
(docs/worker-reads.md, "The catalog's edges", lists every bound with the tests that pin it).

Each section's docstrings name the limit in the installed vLLM 0.32.0 (`gmr` =
v1/worker/gpu_model_runner.py, `ib` = v1/worker/gpu_input_batch.py, `bt` =
v1/worker/block_table.py). The look-alike engine (tinytrace.SETTINGS): 16 KV blocks of 4 tokens,
a budget of 32 tokens and 4 requests a step, max_model_len 64."""

from __future__ import annotations

import json

import tinytrace as tt
from tinytrace import cached, intro, new, resumed


def write(tmp_path, scheduled, settings=None, zero=None, manifest=None, **tables):
    """Steps 0..the last listed one, each step's total and counts those of its rows; `zero`:
    step -> new_block_ids_to_zero; `manifest`: top-level manifest keys; other keyword arguments
    are tables, or step columns given as `step_<column>` (a callable of the step)."""
    zero = zero or {}
    columns = {k[5:]: tables.pop(k) for k in list(tables) if k.startswith("step_")}
    n = 1 + max(r["step"] for r in scheduled)

    def listed(i):
        return [r for r in scheduled if r["step"] == i and r.get("kind")]

    steps = tt.steps(
        n, total_num_scheduled_tokens=lambda i: sum(r.get("num_scheduled_tokens") or 0
                                                    for r in scheduled if r["step"] == i),
        num_new=lambda i: sum(r["kind"] == "new" for r in listed(i)),
        num_cached=lambda i: sum(r["kind"] != "new" for r in listed(i)),
        new_block_ids_to_zero=lambda i: zero.get(i), **columns)
    return tt.write(tmp_path, {"steps": steps, "scheduled": scheduled, **tables},
                    settings=settings, **(manifest or {}))


# --- budget.tokens ------------------------------------------------------------------------------
# gmr:516 sizes the runner's token buffers at max_num_batched_tokens (input_ids, gmr:771); a step's
# tokens are gathered into input_ids.cpu[:total] (gmr:1979). At the edge: 32 tokens fit
# (test_budget.py::test_tokens_chunked_prefill_fills_the_budget), 33 do not
# (test_budget.py::test_tokens_two_whole_prefills_over_budget).

def test_budget_tokens_one_below_the_budget(tmp_path):
    """31 tokens in a step of a 32-token budget."""
    write(tmp_path, [new(0, "a", 0, 20, [0, 1, 2, 3, 4]), new(0, "b", 0, 11, [5, 6, 7], pos=1)],
          requests=[intro(0, "a", 20), intro(0, "b", 11, pos=1)])
    assert tt.found(tmp_path, "budget.tokens") == []


# --- budget.seqs --------------------------------------------------------------------------------
# ib:329 `assert new_req_index < self.max_num_reqs` (max_num_seqs, gmr:517): rows 0..3 of 4.
# At the edge: 4 requests fit (test_budget.py::test_seqs_fifth_request_after_one_finished), 5
# do not (test_budget.py::test_seqs_fifth_request_while_four_run).

def test_budget_seqs_one_below(tmp_path):
    """Three requests in a step of an engine with 4 batch rows."""
    write(tmp_path, [new(0, r, 0, 2, [i], pos=i) for i, r in enumerate("abc")],
          requests=[intro(0, r, 2, pos=i) for i, r in enumerate("abc")])
    assert tt.found(tmp_path, "budget.seqs") == []


# --- tokens.beyond_model_len --------------------------------------------------------------------
# The token buffer is max_model_len wide (ib:132), so positions num_computed_tokens ..
# num_computed_tokens + scheduled - 1 must stay below max_model_len (gmr:1967); and a row that
# samples writes its token at num_computed_tokens + scheduled, which gmr:3574 asserts is below
# max_model_len ("Sampled token IDs exceed the max model length"). So a sampling request's row
# may reach max_model_len - 1 (the scheduler's cap, scheduler.py:716-721), a pooling request's
# max_model_len.

def _decoding_to(tmp_path, last_step, drafts=False):
    # a's 60- or 62-token prompt in two chunks (budget 32), then one decode a step: its
    # computed + scheduled is 62 after step 1, 63 after step 2, 64 after step 3, 65 after step 4.
    # With drafts, a's 60-token prompt decodes with 2 drafts at step 2 (60 + 3 = 63) and, one
    # of them accepted, with 1 at step 3 (62 + 2 = 64).
    if drafts:
        rows = [new(0, "a", 0, 32, list(range(8))),
                cached(1, "a", 32, 28, list(range(8, 15)), num_output_tokens=0),
                cached(2, "a", 60, 3, [15], num_output_tokens=1, spec_token_ids=[7, 8]),
                cached(3, "a", 62, 2, None, num_output_tokens=3, spec_token_ids=[9])]
        prompt = 60
    else:
        rows = [new(0, "a", 0, 32, list(range(8))),
                cached(1, "a", 32, 30, list(range(8, 16)), num_output_tokens=0),
                cached(2, "a", 62, 1, None, num_output_tokens=1),
                cached(3, "a", 63, 1, None, num_output_tokens=2),
                cached(4, "a", 64, 1, [16], num_output_tokens=3)]
        prompt = 62
    write(tmp_path, [r for r in rows if r["step"] <= last_step],
          settings={"num_kv_blocks": 32}, requests=[intro(0, "a", prompt)])


def test_beyond_model_len_sampling_row_at_the_edge(tmp_path):
    """Step 2 computes position 62 (62 + 1 = 63 = max_model_len - 1) and samples into position
    63, the buffer's last; step 1 (62) is one below."""
    _decoding_to(tmp_path, last_step=2)
    assert tt.found(tmp_path, "tokens.beyond_model_len") == []


def test_beyond_model_len_sampling_row_one_above(tmp_path):
    """Step 3's 63 + 1 = 64 = max_model_len: its sampled token would go to position 64, past
    the buffer (gmr:3574 asserts); step 4 runs past max_model_len itself."""
    _decoding_to(tmp_path, last_step=4)
    assert tt.found(tmp_path, "tokens.beyond_model_len") == [
        (3, "a", "num_computed_tokens 63 + scheduled 1 = max_model_len 64, no position left "
                 "for the token it samples"),
        (4, "a", "num_computed_tokens 64 + scheduled 1 > max_model_len 64")]


def test_beyond_model_len_drafts_count(tmp_path):
    """Drafts are positions too: 60 + 3 = 63 at step 2 is within the edge; 62 + 2 = 64 at step 3
    is not (the worker asserts whenever its draft is accepted)."""
    _decoding_to(tmp_path, last_step=3, drafts=True)
    assert tt.found(tmp_path, "tokens.beyond_model_len") == [
        (3, "a", "num_computed_tokens 62 + scheduled 2 = max_model_len 64, no position left "
                 "for the token it samples")]


POOLING = json.dumps({"__type__": "PoolingParams", "task": "embed"})


def _pooling_prompt(tmp_path, prompt):
    # p, a pooling request (no sampling params), prefills its prompt in two chunks
    write(tmp_path, [new(0, "p", 0, 32, list(range(8))),
                     cached(1, "p", 32, prompt - 32, list(range(8, 17)), num_output_tokens=0)],
          settings={"num_kv_blocks": 32},
          requests=[{**intro(0, "p", prompt), "pooling_params": POOLING}])


def test_beyond_model_len_pooling_row_at_the_edge(tmp_path):
    """A pooling request samples nothing: its 64 tokens may fill max_model_len exactly."""
    _pooling_prompt(tmp_path, 64)
    assert tt.found(tmp_path, "tokens.beyond_model_len") == []


def test_beyond_model_len_pooling_row_one_above(tmp_path):
    """65 tokens: position 64 is past the token buffer, sampling or not."""
    _pooling_prompt(tmp_path, 65)
    assert tt.found(tmp_path, "tokens.beyond_model_len") == [
        (1, "p", "num_computed_tokens 32 + scheduled 33 > max_model_len 64")]


def test_beyond_model_len_orphan_taken_as_not_sampling(tmp_path):
    """Attached mid-stream: x's introduction (and so whether it samples) is unknown, so 63 + 1 =
    64 is not reported; 64 + 1 is."""
    write(tmp_path, [cached(0, "x", 63, 1, None, num_output_tokens=5),
                     cached(1, "x", 64, 1, None, num_output_tokens=6)],
          manifest={"attached_mid_stream": True})
    assert tt.found(tmp_path, "tokens.beyond_model_len") == [
        (1, "x", "num_computed_tokens 64 + scheduled 1 > max_model_len 64")]


# --- tokens.beyond_request ----------------------------------------------------------------------
# The row's positions must hold known tokens: num_computed_tokens + scheduled <= prompt + outputs
# + drafts (the token buffer holds num_tokens_no_spec plus the drafts, ib:385 and ib:517-519).
# At the edge and one above: test_tokens.py::test_beyond_request_decode_one_token /
# ::test_beyond_request_decode_past_its_tokens.

def test_beyond_request_one_below(tmp_path):
    """A prefill chunk of 7 of an 8-token prompt."""
    write(tmp_path, [new(0, "a", 0, 7, [0, 1])], requests=[intro(0, "a", 8)])
    assert tt.found(tmp_path, "tokens.beyond_request") == []


# --- tokens.nonpositive -------------------------------------------------------------------------
# Each count must be at least 1: np.repeat raises on a negative count (gmr:1944), and 0 puts the
# row's logits index on the previous row's last token. At the edge (1) and below (0, -3):
# test_tokens.py::test_nonpositive_one_token_each / ::test_nonpositive_zero_and_negative_counts.

def test_nonpositive_one_above(tmp_path):
    """A chunk of 2 tokens."""
    write(tmp_path, [new(0, "a", 0, 2, [0])], requests=[intro(0, "a", 8)])
    assert tt.found(tmp_path, "tokens.nonpositive") == []


# --- outputs.count_below_held -------------------------------------------------------------------
# gmr:1405-1409 truncates the worker's outputs when num_output_tokens < len(output_token_ids);
# a count above them is never read. At the edge (equal) and one below:
# test_worker_reads_tokens.py::test_count_right_while_decoding /
# ::test_count_one_short_while_decoding.

def test_count_below_held_one_above(tmp_path):
    """Step 3 says 4 outputs where the worker holds 3: nothing is truncated."""
    rows = [new(0, "a", 0, 4, [0])] + [
        cached(s, "a", 3 + s, 1, None, num_output_tokens=4 if s == 3 else s) for s in (1, 2, 3)]
    write(tmp_path, rows, requests=[intro(0, "a", 4)],
          model_outputs=[{"step": s, "req_id": "a", "pos": 0, "sampled_token_ids": [100 + s]}
                         for s in range(4)])
    assert tt.found(tmp_path, "outputs.count_below_held") == []


# --- outputs.all_token_ids_missing -------------------------------------------------------------
# An async worker takes all_token_ids[req_id][-num_output_tokens:] as the outputs of a row that
# is not in its batch (gmr:1438): a shorter list gives it fewer. One below the edge:
# test_worker_reads_tokens.py::test_all_token_ids_shorter_than_the_outputs; above it (the whole
# prompt and outputs, as the scheduler sends): ::test_resumed_with_all_token_ids.

def test_all_token_ids_as_long_as_the_outputs(tmp_path):
    """a comes back after its preemption with its 2 outputs and exactly 2 tokens: enough."""
    write(tmp_path, [new(0, "a", 0, 4, [0]), cached(1, "a", 4, 1, [1], num_output_tokens=1),
                     {**resumed(3, "a", 0, 6, [2, 3]), "num_output_tokens": 2,
                      "all_token_ids": [100, 101]}],
          settings={"async_scheduling": True}, requests=[intro(0, "a", 4)],
          preempted=[{"step": 2, "req_id": "a"}],
          model_outputs=[{"step": s, "req_id": "a", "pos": 0, "sampled_token_ids": [100 + s]}
                         for s in (0, 1)])
    assert tt.found(tmp_path, "outputs.all_token_ids_missing") == []


# --- blocks.double_owner (a prefix hit's share) -------------------------------------------------
# A new request computes positions nc.. (gmr:1953) and writes their KV through its table
# (bt:370): only the nc // block_size blocks wholly below nc may be another live request's. At
# the edge: test_blocks.py::test_double_owner_prefix_hit_shares_a_full_block (nc 4, one block
# shared); below: ::test_double_owner_new_request_takes_a_live_block (nc 0, one shared).

def test_double_owner_prefix_hit_shares_one_block_too_many(tmp_path):
    """b's hit of 4 tokens shares a's blocks 1 and 2: block 2 (a's tokens 4..6) is where b
    writes its own tokens 4..7."""
    write(tmp_path, [new(0, "a", 0, 7, [1, 2]), cached(1, "a", 7, 1, None, num_output_tokens=1),
                     new(1, "b", 4, 4, [1, 2], pos=1)],
          requests=[intro(0, "a", 7), intro(1, "b", 8, pos=1)])
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (1, "b", "2 block(s) (e.g. 1) still held by a; prefix hits cover 1")]


# --- spec.too_many ------------------------------------------------------------------------------
# The logits of a row start at its last token less its drafts (gmr:2651-2652, cu_num_scheduled
# - (drafts + 1)): drafts must stay below the row's count. At the edge (drafts = count) and one
# below: test_spec.py::test_too_many_drafts (a: 2 for 2) / ::test_drafts_with_one_token_more.

def test_too_many_one_above(tmp_path):
    """2 drafts for 1 scheduled token."""
    write(tmp_path, [new(0, "a", 0, 4, [0]),
                     cached(1, "a", 4, 1, [1], num_output_tokens=1, spec_token_ids=[6, 7])],
          requests=[intro(0, "a", 4)])
    assert tt.found(tmp_path, "spec.too_many") == [(1, "a", "2 drafts for 1 scheduled tokens")]


# --- spec.beyond_configured / spec.to_schedule_out_of_range -------------------------------------
# gmr:1796-1803 finds a row's previous drafts at prev_index * num_speculative_tokens: a row's
# drafts must be at most num_speculative_tokens. At the edge and one above:
# test_worker_reads_spec.py::test_as_many_drafts_as_configured / ::test_more_drafts_than_configured.
# num_spec_tokens_to_schedule (read at gmr:4763, the count each proposer drafts into buffers of
# num_speculative_tokens) must be in 0..num_speculative_tokens; both edges and their outer
# neighbours (0, -1, 2, 3): test_worker_reads_spec.py::test_to_schedule_out_of_range.

NGRAM_2 = {"speculative": {"method": "ngram", "num_speculative_tokens": 2}}


def test_beyond_configured_one_below(tmp_path):
    """One draft on an engine of 2."""
    write(tmp_path, [new(0, "a", 0, 4, [0]),
                     cached(1, "a", 4, 2, [1], num_output_tokens=1, spec_token_ids=[6])],
          settings=NGRAM_2, requests=[intro(0, "a", 4)])
    assert tt.found(tmp_path, "spec.beyond_configured") == []


def test_to_schedule_inside_both_edges(tmp_path):
    """num_spec_tokens_to_schedule 1 on an engine of 2: one above the lower edge, one below the
    upper."""
    write(tmp_path, [new(0, "a", 0, 4, [0]), cached(1, "a", 4, 1, [1], num_output_tokens=1)],
          settings=NGRAM_2, requests=[intro(0, "a", 4)], step_num_spec_tokens_to_schedule=1)
    assert tt.found(tmp_path, "spec.to_schedule_out_of_range") == []


# --- blocks.out_of_range / blocks.zeroed_out_of_range -------------------------------------------
# Block ids index the KV cache (num_blocks rows): bt:370 loads a table entry into the slot
# mapping unchecked, and the CPU runner zeroes kv[block_id] (cpu_model_runner.py:133). The upper
# edge (15 in, 16 out, 14 in) is pinned by test_blocks.py::test_out_of_range_* and
# test_worker_reads_blocks.py::test_zeroed_out_of_range_*; the lower edge here.

def test_out_of_range_lower_edge(tmp_path):
    """Block 0 (vLLM's null block) is inside the cache; -1 is not, in a grant or a list to
    zero."""
    write(tmp_path, [new(0, "a", 0, 8, [0, 1]), new(0, "b", 0, 4, [-1], pos=1)],
          zero={0: [0, 1, -1]}, requests=[intro(0, "a", 8), intro(0, "b", 4, pos=1)])
    assert tt.found(tmp_path, "blocks.out_of_range") == [(0, "b", "block id -1..-1 outside 0..15")]
    assert tt.found(tmp_path, "blocks.zeroed_out_of_range") == [
        (0, None, "block id -1..-1 to zero outside 0..15")]


# --- encoder.input_unknown ----------------------------------------------------------------------
# gmr:2758 indexes req_state.mm_features[idx] (IndexError from len(mm_features) on); a feature
# whose offset + length <= num_computed_tokens at its introduction comes without data
# (multimodal/utils.py:234, strip_covered_mm_data) and gmr:2759 skips it. At the index edge
# (idx = n - 1) and one above (idx = n): test_encoder.py::test_input_unknown_second_of_two_images /
# ::test_input_unknown_index_past_the_features; the stripping edge (nc = offset + length) and one
# below: ::test_input_unknown_stripped_feature / ::test_input_unknown_feature_not_quite_covered.

def _one_image_prefill(tmp_path, inputs, computed=0):
    # a's 8-token prompt with one image at tokens 0..3, prefilled with `computed` tokens hit
    write(tmp_path, [{**new(0, "a", computed, 8 - computed, [0, 1]), "encoder_inputs": inputs}],
          requests=[intro(0, "a", 8)],
          mm_inputs=[{"step": 0, "req_id": "a", "pos": 0, "identifier": "img-a",
                      "mm_hash": "proc-img-a", "modality": "image", "offset": 0, "length": 4}])


def test_input_unknown_index_two_past(tmp_path):
    """Index 2 of one feature, and -1 (Python would take the last feature: no scheduler means
    that)."""
    _one_image_prefill(tmp_path, [2, -1])
    assert sorted(tt.found(tmp_path, "encoder.input_unknown")) == [
        (0, "a", "encoder input -1 outside the 1 mm_features of its introduction at step 0"),
        (0, "a", "encoder input 2 outside the 1 mm_features of its introduction at step 0")]


def test_input_unknown_stripped_one_above(tmp_path):
    """The hit covers one token past the placeholder: its data was stripped all the same."""
    _one_image_prefill(tmp_path, [0], computed=5)
    assert tt.found(tmp_path, "encoder.input_unknown") == [
        (0, "a", "encoder input 0 (img-a, tokens 0..3) came without its data: "
                 "num_computed_tokens 5 at its introduction (step 0) covered it")]


# --- encoder.freed_while_needed (the chunk's window) --------------------------------------------
# A step reads the cached output of every feature whose placeholder overlaps [nc, nc + count)
# (gmr:3027, multimodal/utils.py:122 get_mm_features_in_window: offset + length > nc and
# offset < nc + count). The lower edge: a placeholder that ends at nc is not read
# (test_encoder.py::test_freed_while_needed_placeholder_in_the_first_chunk). The upper edge
# (offset = nc + count) cannot be met by the request that encodes the input: it is encoded with
# the chunk that reaches the placeholder's start.

def _image_then_chunk(tmp_path, length):
    # a's 12-token prompt in chunks of 6 (steps 0 and 1); its image at tokens 0..length-1 is
    # encoded with the first chunk and freed at step 1, whose window is tokens 6..11
    write(tmp_path, [{**new(0, "a", 0, 6, [0, 1]), "encoder_inputs": [0]},
                     cached(1, "a", 6, 6, [2], num_output_tokens=0)],
          requests=[intro(0, "a", 12)],
          mm_inputs=[{"step": 0, "req_id": "a", "pos": 0, "identifier": "img-a",
                      "mm_hash": "proc-img-a", "modality": "image", "offset": 0,
                      "length": length}],
          freed_mm=[{"step": 1, "pos": 0, "mm_hash": "img-a"}])


def test_freed_while_needed_placeholder_one_past_the_chunk(tmp_path):
    """The placeholder ends at token 6, the first of step 1's window: the worker reads it."""
    _image_then_chunk(tmp_path, 7)
    assert tt.found(tmp_path, "encoder.freed_while_needed") == [
        (1, "a", "reads (a chunk over its placeholder) img-a, freed at step 1")]


def test_freed_while_needed_placeholder_one_short_of_the_chunk(tmp_path):
    """The placeholder ends at token 4, two before step 1's window."""
    _image_then_chunk(tmp_path, 5)
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []


# --- blocks.null_needed (the sliding window's edge) ---------------------------------------------
# A sliding-window layer's query at position p reads keys p - sliding_window + 1 .. p
# (v1/attention/backends/flash_attn.py:1082, window (sliding_window - 1, 0)), so a row's first
# read is at num_computed_tokens - sliding_window + 1, the count of tokens vLLM skips
# (single_type_kv_cache_manager.py:1175-1178): a table position below (that) // block_size may be
# the null block, none from it on. The block-level edge is pinned by test_blocks_groups.py
# (::test_null_needed_sliding_table_null_behind_the_window / ::..._null_inside_the_window); the
# token-level edge here, by the window's width.

FULL = {"spec": "FullAttentionSpec", "kind": "full", "block_size": 4, "layers": 1}


def _hit_with_window(tmp_path, window):
    # b hits 12 of a's 16 tokens and its sliding table is [null, null, 3, 9]: positions 0 and 1
    # (tokens 0..7) null; its first scheduled token, 12, reads back to 13 - window
    sliding = {"spec": "SlidingWindowSpec", "kind": "sliding_window", "block_size": 4,
               "sliding_window": window, "layers": 1}
    rows = [{**new(0, "a", 0, 16, []), "new_block_ids": [[1, 2, 3, 4], [5, 6, 7, 8]]},
            cached(1, "a", 16, 1, None, num_output_tokens=1),
            {**new(1, "b", 12, 4, [], pos=0), "new_block_ids": [[0, 0, 3, 9], [5, 6, 7, 10]]}]
    write(tmp_path, rows, settings={"kv_cache_groups": [sliding, FULL]},
          requests=[intro(0, "a", 16), intro(1, "b", 16)])


def test_null_needed_window_reaches_the_first_real_block_exactly(tmp_path):
    """Window 5: b's first read is token 8, position 2's first: the nulls are all behind it."""
    _hit_with_window(tmp_path, 5)
    assert tt.found(tmp_path, "blocks.null_needed") == []


def test_null_needed_window_one_short(tmp_path):
    """Window 4: the first read is token 9."""
    _hit_with_window(tmp_path, 4)
    assert tt.found(tmp_path, "blocks.null_needed") == []


def test_null_needed_window_one_token_into_the_null(tmp_path):
    """Window 6: the first read is token 7, in position 1, which is null."""
    _hit_with_window(tmp_path, 6)
    assert tt.found(tmp_path, "blocks.null_needed") == [
        (1, "b", "KV cache group 0 (sliding_window): the null block at table position 1, "
                 "which its attention reads (positions from 1 on)")]


# --- blocks.null_needed (a Mamba hit's state) ---------------------------------------------------
# A new or resumed request's first state is read at table position (nc - 1) // block_size
# (v1/worker/mamba_utils.py:1495), cdiv(nc, block_size) - 1: its table must reach that position
# with a real block there. A real block at it and the null block there:
# test_blocks_groups.py::test_null_needed_mamba_hit_starts_from_the_hit_state /
# ::test_null_needed_mamba_group_missed_the_hit; the table's length here.

MAMBA = {"spec": "MambaSpec", "kind": "mamba", "block_size": 4, "layers": 1,
         "mamba_cache_mode": "align"}


def _mamba_hit(tmp_path, b_ids):
    # b hits a's first 4 tokens, whose state is a's block 1 (table position 0)
    rows = [{**new(0, "a", 0, 8, []), "new_block_ids": [[1, 2], [3, 4]]},
            {**cached(1, "a", 8, 1, None, num_output_tokens=1), "new_block_ids": [[5], [6]]},
            {**new(1, "b", 4, 4, [], pos=1), "new_block_ids": [b_ids, [3, 7]]}]
    write(tmp_path, rows, settings={"kv_cache_groups": [MAMBA, FULL]},
          requests=[intro(0, "a", 8), intro(1, "b", 8, pos=1)])


def test_null_needed_mamba_table_reaches_the_state_exactly(tmp_path):
    """b's Mamba table is [1]: one block, the hit's state at position 0."""
    _mamba_hit(tmp_path, [1])
    assert tt.found(tmp_path, "blocks.null_needed") == []


def test_null_needed_mamba_table_empty(tmp_path):
    """b's Mamba table is empty: the worker reads the state at position 0 of a row it never
    wrote."""
    _mamba_hit(tmp_path, [])
    assert tt.found(tmp_path, "blocks.null_needed") == [
        (1, "b", "KV cache group 0 (mamba): no block at table position 0 (0 in the table), the "
                 "state its computed tokens left, which the step starts from")]


# --- tokens.new_token_ids_length ----------------------------------------------------------------
# gmr:1392 takes new_token_ids[i] for cached row i (IndexError with fewer lists) and appends its
# last nc + len - num_tokens entries to the outputs: each list must be as long as the row's
# tokens without drafts (scheduler.py _make_cached_request_data). At the edge and one below:
# test_worker_reads_spec.py::test_new_token_ids_right_or_unread /
# ::test_new_token_ids_of_the_wrong_length.

PP_2 = {"parallel": {"pipeline_parallel_size": 2}}


def _pipeline(tmp_path, b_tokens, lists=2):
    # a and b prefill at 0 and decode at 1 on a sync 2-stage pipeline; b's list at step 1 is
    # b_tokens; `lists`: the lists step 1 sends
    write(tmp_path, [new(0, "a", 0, 4, [0]), new(0, "b", 0, 4, [1], pos=1),
                     cached(1, "a", 4, 1, None, num_output_tokens=1, new_token_ids=[10]),
                     cached(1, "b", 4, 1, None, pos=1, num_output_tokens=1,
                            new_token_ids=b_tokens)],
          settings=PP_2, requests=[intro(0, "a", 4), intro(0, "b", 4, pos=1)],
          step_cached_new_token_ids_len=lambda i: 0 if i == 0 else lists)


def test_new_token_ids_one_token_too_many(tmp_path):
    """b's list has 2 tokens for its 1 scheduled: the first stage would take an output token
    that was never sampled."""
    _pipeline(tmp_path, [11, 12])
    assert tt.found(tmp_path, "tokens.new_token_ids_length") == [
        (1, "b", "2 new tokens for 1 scheduled without drafts")]


def test_new_token_ids_one_list_too_many(tmp_path):
    """Three lists for two cached requests: the worker reads lists 0 and 1 only, but the count
    says the scheduler's lists do not follow req_ids, and the check reports the step (stricter
    than the worker: see docs/worker-reads.md)."""
    _pipeline(tmp_path, [11], lists=3)
    assert tt.found(tmp_path, "tokens.new_token_ids_length") == [
        (1, None, "3 new_token_ids lists for 2 cached requests")]


# --- the same step preempts and schedules -------------------------------------------------------
# Scheduler.schedule() never schedules a request it preempted in the same call (the waiting
# queue is skipped once it preempted, scheduler.py:900), but reset_prefix_cache(
# reset_running_requests=True) preempts between steps (scheduler.py:2850-2866): the next step
# lists the ids in preempted_req_ids and may resume them in that very step. The worker drops them
# from its batch first (gmr:1227: resumed ids are taken as unscheduled) and replaces their tables
# (gmr:1428); a cached row instead would append to the stale table (gmr:1422).

def _reset_then(tmp_path, a_back):
    # a and b decode from step 0 (blocks 1, 3 and 2, 4); reset_prefix_cache preempts both before
    # step 3, which lists them in preempted_req_ids, resumes b on blocks 1 and 3 (a's old ones)
    # and introduces c on b's old block 2 (zeroed, as every block handed out there); a_back is
    # a's row at step 3
    rows = [new(0, "a", 0, 4, [1]), new(0, "b", 0, 4, [2], pos=1),
            cached(1, "a", 4, 1, [3], num_output_tokens=1),
            cached(1, "b", 4, 1, [4], pos=1, num_output_tokens=1),
            cached(2, "a", 5, 1, None, num_output_tokens=2),
            cached(2, "b", 5, 1, None, pos=1, num_output_tokens=2),
            a_back,
            {**resumed(3, "b", 0, 7, [1, 3], pos=1), "num_output_tokens": 3},
            new(3, "c", 0, 4, [2])]
    write(tmp_path, rows, zero={0: [1, 2], 1: [3, 4], 3: [5, 6, 1, 3, 2]},
          requests=[intro(0, "a", 4), intro(0, "b", 4, pos=1), intro(3, "c", 4)],
          preempted=[{"step": 3, "req_id": "a"}, {"step": 3, "req_id": "b"}])


def test_preempted_and_resumed_in_the_same_step(tmp_path):
    """a and b are resumed in the step that lists their preemption, their old blocks handed to
    each other and to c in that step: every check is silent."""
    _reset_then(tmp_path, {**resumed(3, "a", 0, 7, [5, 6]), "num_output_tokens": 3})
    for inv in ("lifecycle.preempted_not_resumed", "lifecycle.resumed_without_preemption",
                "lifecycle.resumed_without_blocks", "blocks.double_owner",
                "blocks.zeroed_held", "blocks.table_short", "tokens.beyond_request"):
        assert tt.found(tmp_path, inv) == [], inv


def test_preempted_and_scheduled_as_cached_in_the_same_step(tmp_path):
    """a is listed in step 3's preempted_req_ids and scheduled in step 3 as cached: the worker,
    whose batch still holds a from step 2, appends blocks 5 and 6 to the table whose blocks 1
    and 3 b now holds."""
    _reset_then(tmp_path, {**cached(3, "a", 0, 7, [5, 6]), "num_output_tokens": 3})
    assert tt.found(tmp_path, "lifecycle.preempted_not_resumed") == [
        (3, "a", "scheduled as cached after its preemption at step 3, not in resumed_req_ids")]


# --- a block freed and handed out in one step ---------------------------------------------------
# A preemption frees the victim's blocks inside schedule(), and the same call may hand them out
# (kv_cache_manager.free in Scheduler._preempt_request): the hold ends at the preemption's step
# (views.py block_holds). The worker never reads the victim's table again before it is replaced.
# Freed at the preemption's step and handed out there: test_blocks.py::
# test_double_owner_blocks_of_a_preempted_request and test_worker_reads_blocks.py::
# test_zeroed_held_preempted_in_the_same_step (clean). A finished request's blocks are freed in
# the update after its last step and handed out in the next, whose finished_req_ids the worker
# applies first (gmr:1183-1197): test_blocks.py::test_double_owner_blocks_reused_after_finish
# (clean) and ::test_double_owner_blocks_reused_in_the_finishing_step (the near miss). A window's
# release: test_blocks_groups.py::test_double_owner_window_block_*.

def _handed_before_the_preemption(tmp_path):
    # a holds blocks 1 and 2; b is given them (and zeroes block 2) at step 1, a step before
    # a's preemption
    write(tmp_path, [new(0, "a", 0, 7, [1, 2]), cached(1, "a", 7, 1, None, num_output_tokens=1),
                     new(1, "b", 0, 8, [1, 2], pos=1)],
          zero={0: [1, 2], 1: [1, 2]}, requests=[intro(0, "a", 7), intro(1, "b", 8, pos=1)],
          preempted=[{"step": 2, "req_id": "a"}])


def test_double_owner_handed_out_a_step_before_the_preemption(tmp_path):
    """Near miss of the same-step case: a still runs at step 1 and keeps its blocks."""
    _handed_before_the_preemption(tmp_path)
    assert tt.found(tmp_path, "blocks.double_owner") == [
        (1, "b", "2 block(s) (e.g. 1) still held by a; prefix hits cover 0")]


def test_zeroed_held_a_step_before_the_preemption(tmp_path):
    """The same blocks zeroed at step 1 under a, which still attends to them."""
    _handed_before_the_preemption(tmp_path)
    assert tt.found(tmp_path, "blocks.zeroed_held") == [
        (1, "a", "2 block(s) it holds zeroed (e.g. 1), held since step 0")]
