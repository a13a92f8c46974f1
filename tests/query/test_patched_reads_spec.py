"""Drafts, structured output and pipeline parallelism as the worker reads them
(docs/worker-reads.md, items 8-10), broken in the real scheduler's output right after
schedule() returns, and found at the step and request the break names."""

from __future__ import annotations

import dataclasses

import pytest

from vllm_contract.rig import breaks, scenarios
from vllm_contract.rig.harness import Harness
from vllm_contract.trace import open_trace

from checking import findings, hits, patched, serious


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


class FirstStage(Harness):
    """LOOK-ALIKE of pipeline parallelism without async scheduling: the real scheduler fills
    new_token_ids as for a PP engine (use_pp), and the manifest says pipeline_parallel_size 2;
    no second stage runs."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.vllm_config.parallel_config.pipeline_parallel_size = 2
        self.scheduler.use_pp = True


@pytest.fixture
def pipeline_lookalike(monkeypatch):
    monkeypatch.setattr(scenarios, "Harness", FirstStage)


def test_pipeline_token_list_dropped(tiny_model, tmp_path, pipeline_lookalike):
    broken = patched(tiny_model, tmp_path, "spec_decode", breaks.drop_pipeline_token_list())
    assert hits(findings(tmp_path), "tokens.new_token_ids_length") == broken


@pytest.mark.parametrize("name", ["spec_decode", "chunked_prefill", "preemption"])
def test_pipeline_token_lists_as_sent(tiny_model, tmp_path, pipeline_lookalike, name):
    """The scheduler's own lists (drafts left out, prompt chunks, resumed requests) pass."""
    scenarios.run(name, tiny_model, tmp_path)
    steps = open_trace(tmp_path).read("steps").to_pylist()
    assert sum(s["cached_new_token_ids_len"] for s in steps), (
        "the look-alike sent no token lists: the test proves nothing")
    assert serious(findings(tmp_path)) == []
