"""Drafts, structured output and pipeline parallelism as the worker reads them
(docs/worker-reads.md, items 8-10), broken in the real scheduler's output right after
schedule() returns, and found at the step and request the break names."""

from __future__ import annotations

import dataclasses

import pytest

from vllm_contract.rig import breaks, scenarios

from checking import findings, hits, patched


def test_draft_on_an_engine_without_a_drafter(tiny_model, tmp_path):
    broken = patched(tiny_model, tmp_path, "aborts", breaks.draft_without_drafter())
    assert hits(findings(tmp_path), "spec.without_drafter") == broken


@pytest.fixture
def structured_with_drafter(monkeypatch):
    """structured_output with the ngram drafter of spec_decode (2 tokens)."""
    s = scenarios.SCENARIOS["structured_output"]
    monkeypatch.setitem(scenarios.SCENARIOS, "structured_output", dataclasses.replace(
        s, config=dataclasses.replace(s.config, num_spec_tokens=2)))


def test_structured_output_unflagged_async(tiny_model, tmp_path, structured_with_drafter):
    """Two batches in flight (the AsyncScheduler) and a drafter: the worker reads the flag."""
    broken = patched(tiny_model, tmp_path, "structured_output",
                     breaks.unflag_structured_output(), batch_queue=2)
    assert hits(findings(tmp_path), "structured.unflagged") == broken


def test_structured_output_unflagged_sync(tiny_model, tmp_path, structured_with_drafter):
    """The same break on a sync engine: its worker never reads the flag."""
    patched(tiny_model, tmp_path, "structured_output", breaks.unflag_structured_output())
    assert hits(findings(tmp_path), "structured.unflagged") == []
