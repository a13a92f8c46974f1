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
