"""The outputs a worker keeps for a cached request (docs/worker-reads.md, "Unguarded and
breakable" 1 and 7) broken in the real scheduler's output right after schedule(): the
all_token_ids an async worker rebuilds them from, and a num_output_tokens below what a sync
worker holds."""

from __future__ import annotations

import pytest

from vllm_contract.rig import breaks

from checking import findings, hits, patched


@pytest.mark.parametrize("scenario", ["preemption", "mixed"])
def test_resumed_row_without_all_token_ids(tiny_model, tmp_path, scenario):
    """Two batches in flight: the first resumed request with outputs loses its all_token_ids,
    reported for that row alone."""
    broken = patched(tiny_model, tmp_path, scenario, breaks.drop_all_token_ids(), batch_queue=2)
    report = findings(tmp_path)
    assert hits(report, "outputs.all_token_ids_missing") == broken
    assert hits(report, "outputs.all_token_ids_mismatch") == []


def test_resumed_row_without_all_token_ids_in_a_sync_run(tiny_model, tmp_path):
    """One batch in flight: the worker kept the outputs and does not read the field."""
    patched(tiny_model, tmp_path, "preemption", breaks.drop_all_token_ids())
    assert hits(findings(tmp_path), "outputs.all_token_ids_missing") == []


def test_resumed_row_with_stale_all_token_ids(tiny_model, tmp_path):
    """Two batches in flight: the first resumed request is sent its tokens without its last
    output, long enough but ending elsewhere: reported for that row alone."""
    broken = patched(tiny_model, tmp_path, "preemption", breaks.stale_all_token_ids(),
                     batch_queue=2)
    report = findings(tmp_path)
    assert hits(report, "outputs.all_token_ids_mismatch") == broken
    assert hits(report, "outputs.all_token_ids_missing") == []


@pytest.mark.parametrize("scenario", ["mixed", "chunked_prefill"])
def test_decoding_row_one_output_short(tiny_model, tmp_path, scenario):
    """One batch in flight: a decoding request's count one short, reported for that row alone
    (the next row's right count is more than the worker then holds)."""
    broken = patched(tiny_model, tmp_path, scenario, breaks.undercount_outputs())
    report = findings(tmp_path)
    assert hits(report, "outputs.count_below_held") == broken
    (f,) = [f for f in report.findings if f.invariant == "outputs.count_below_held"]
    assert "(sampled before this step)" in f.message
