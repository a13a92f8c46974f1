"""Encoder reads of the worker (docs/worker-reads.md, "Unguarded and breakable" 2 and 3) broken in
the real scheduler's output right after schedule(), with one batch in flight or two. The encoder
inputs are LOOK-ALIKE (the CPU build cannot schedule a multimodal model): rig/harness.py stamps
them on real steps (encoder_lookalike), or the break stamps them itself."""

from __future__ import annotations

import pytest

from vllm_contract.rig import breaks

from checking import findings, hits, patched


@pytest.mark.parametrize("batch_queue", [1, 2])
def test_encoder_hash_freed_twice(tiny_model, tmp_path, batch_queue):
    """The first freed hash freed again two steps later: reported at that step alone."""
    broken = patched(tiny_model, tmp_path, "encoder_lookalike", breaks.free_encoder_twice(),
                     batch_queue=batch_queue)
    assert hits(findings(tmp_path), "encoder.free_unknown") == broken


@pytest.mark.parametrize("batch_queue", [1, 2])
def test_encoder_input_past_the_features(tiny_model, tmp_path, batch_queue):
    """A new request's image and one index past it: reported for that row alone."""
    broken = patched(tiny_model, tmp_path, "encoder_lookalike",
                     breaks.encoder_input_past_features(), batch_queue=batch_queue)
    assert hits(findings(tmp_path), "encoder.input_unknown") == broken


@pytest.mark.parametrize("batch_queue", [1, 2])
def test_encoder_input_of_a_stripped_feature(tiny_model, tmp_path, batch_queue):
    """A prefix hit covers the image, and its encoder is scheduled anyway: reported for that
    row alone (the request's other rows schedule no encoder input)."""
    broken = patched(tiny_model, tmp_path, "prefix_cache", breaks.encoder_input_stripped(),
                     batch_queue=batch_queue)
    report = findings(tmp_path)
    assert hits(report, "encoder.input_unknown") == broken
    (f,) = [f for f in report.findings if f.invariant == "encoder.input_unknown"]
    assert "came without its data" in f.message
