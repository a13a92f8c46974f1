"""Drafts, structured output and pipeline parallelism as the worker reads them
(docs/worker-reads.md, items 8-10), broken in the real scheduler's output right after
schedule() returns, and found at the step and request the break names."""

from __future__ import annotations

from vllm_contract.rig import breaks

from checking import findings, hits, patched


def test_draft_on_an_engine_without_a_drafter(tiny_model, tmp_path):
    broken = patched(tiny_model, tmp_path, "aborts", breaks.draft_without_drafter())
    assert hits(findings(tmp_path), "spec.without_drafter") == broken
