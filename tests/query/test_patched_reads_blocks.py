"""Block reads of the worker (docs/worker-reads.md, "Unguarded and breakable" 5 and 6) broken in
the real scheduler's output right after schedule(), with one batch in flight or two: the blocks
to zero, one grant's blocks, and the length of a block table.

The CPU build's KV cache needs no zeroing (KVCacheConfig.needs_kv_cache_zeroing: Mamba layers or
mixed precision), so its scheduler sends new_block_ids_to_zero as None in every step; the zeroing
breaks write the list themselves, and the recorder records what the scheduler sent. With
`zeroing`, the property is patched to True, and the real scheduler fills the list itself (its
managers record each block get_new_blocks hands out, and schedule() drains them)."""

from __future__ import annotations

import pytest

from vllm_contract.rig import breaks, scenarios

from checking import findings, hits, patched

SCENARIO = "chunked_prefill"  # three long prompts, no two sharing a block


ZEROING = ["blocks.zeroed_held", "blocks.zeroed_out_of_range"]


def _config():
    return scenarios.SCENARIOS[SCENARIO].config


@pytest.fixture
def zeroing(monkeypatch):
    from vllm.v1.kv_cache_interface import KVCacheConfig

    monkeypatch.setattr(KVCacheConfig, "needs_kv_cache_zeroing", property(lambda self: True))


@pytest.mark.parametrize(("name", "batch_queue"), [("mixed", 1), ("mixed", 2),
                                                   ("preemption", 1), ("preemption", 2),
                                                   ("spec_decode", 1)])
def test_real_zeroing_is_silent(tiny_model, tmp_path, zeroing, name, batch_queue):
    """The real scheduler's own lists, with prefix hits, preemption, aborts and reused ids
    (mixed) and drafts' lookahead blocks: each step's list is blocks granted in that step, and
    neither check reports anything."""
    from vllm_contract.trace import open_trace

    scenarios.run(name, tiny_model, tmp_path, batch_queue=batch_queue)
    t = open_trace(tmp_path)
    granted: dict[int, set] = {}
    for r in t.read("scheduled").to_pylist():
        for group in r["new_block_ids"] or []:
            granted.setdefault(r["step"], set()).update(group)
    lists = {s["step"]: s["new_block_ids_to_zero"] for s in t.read("steps").to_pylist()
             if s["new_block_ids_to_zero"]}
    assert lists, "the scheduler zeroed nothing: the run proves nothing"
    assert {s: sorted(set(z) - granted.get(s, set())) for s, z in lists.items()
            if set(z) - granted.get(s, set())} == {}
    report = findings(tmp_path, ZEROING)
    assert [(f.invariant, f.step, f.req_id) for f in report.findings] == []


@pytest.mark.parametrize("batch_queue", [1, 2])
def test_zeroing_a_block_its_running_request_holds(tiny_model, tmp_path, batch_queue):
    """The last block of a decoding request's table zeroed: reported for that request at that
    step alone (the rest of the run zeroes nothing)."""
    broken = patched(tiny_model, tmp_path, SCENARIO, breaks.zero_held_block(),
                     batch_queue=batch_queue)
    report = findings(tmp_path, ZEROING)
    assert hits(report, "blocks.zeroed_held") == broken
    assert hits(report, "blocks.zeroed_out_of_range") == []


@pytest.mark.parametrize("batch_queue", [1, 2])
def test_zeroing_a_held_block_among_the_real_lists(tiny_model, tmp_path, zeroing, batch_queue):
    """The same break where the real scheduler zeroes its new blocks in every step (mixed:
    prefix hits, preemption, reused ids): the added block alone is reported."""
    broken = patched(tiny_model, tmp_path, "mixed", breaks.zero_held_block(),
                     batch_queue=batch_queue)
    report = findings(tmp_path, ZEROING)
    assert hits(report, "blocks.zeroed_held") == broken
    assert hits(report, "blocks.zeroed_out_of_range") == []


def test_zeroing_past_the_cache(tiny_model, tmp_path):
    """Zeroing one block past the cache's last: reported for the step."""
    broken = patched(tiny_model, tmp_path, SCENARIO, breaks.zero_past_cache(_config().num_blocks))
    report = findings(tmp_path, ZEROING)
    assert hits(report, "blocks.zeroed_out_of_range") == broken
    assert hits(report, "blocks.zeroed_held") == []


@pytest.mark.parametrize("batch_queue", [1, 2])
def test_new_blocks_given_twice(tiny_model, tmp_path, batch_queue):
    """A running request's new blocks each given twice in one step: reported for that row."""
    broken = patched(tiny_model, tmp_path, SCENARIO, breaks.repeat_new_blocks(),
                     batch_queue=batch_queue)
    report = findings(tmp_path, ["blocks.repeated_in_grant", "blocks.double_owner"])
    assert hits(report, "blocks.repeated_in_grant") == broken
    assert hits(report, "blocks.double_owner") == []  # a request with itself, in one step


@pytest.mark.parametrize("batch_queue", [1, 2])
def test_table_grown_past_the_row(tiny_model, tmp_path, batch_queue):
    """A running request's table grown to one block past cdiv(max_model_len, block_size) (from
    blocks no one holds): reported at that step alone."""
    c = _config()
    width = -(-c.max_model_len // c.block_size)
    broken = patched(tiny_model, tmp_path, SCENARIO,
                     breaks.grow_table_past_width(c.num_blocks, width), batch_queue=batch_queue)
    report = findings(tmp_path, ["blocks.table_too_long", "blocks.double_owner",
                                 "blocks.out_of_range"])
    assert hits(report, "blocks.table_too_long") == broken
    assert hits(report, "blocks.double_owner") == hits(report, "blocks.out_of_range") == []
    (f,) = [f for f in report.findings if f.invariant == "blocks.table_too_long"]
    assert f"block table of {width + 1} blocks, past the {width}" in f.message
