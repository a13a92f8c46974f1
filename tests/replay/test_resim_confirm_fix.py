"""Confirm a fix (issue 30 §3), on the real vLLM Scheduler: a scheduler bug written as a
Scheduler subclass (rig/bugged.py: one that drops an id from finished_req_ids, one that leaves
a resumed request out of resumed_req_ids so the worker appends its new blocks to the stale
table) is recorded with the subclass; re-run with the stock class, the re-run has no error and
the diff names the step the subclass changed; re-run with the subclass, every step is
identical and the catalog finds on the re-run exactly what it found on the recording."""

from __future__ import annotations

import sys

import pytest

from vllm_contract import replay
from vllm_contract.replay.resim.record import catalog_findings
from vllm_contract.rig import bugged

import resimkit

BUGS = [("drop_finished_once", "aborts", "finished.leaked"),
        ("resume_as_cached", "preemption", "lifecycle.preempted_not_resumed")]


def _found(trace) -> set[tuple]:
    return {(f.invariant, f.step, f.req_id) for f in catalog_findings(trace)}


@pytest.mark.parametrize("name,scenario,invariant", BUGS)
def test_the_stock_class_fixes_it_and_the_subclass_does_it_again(
        name, scenario, invariant, tiny_model, tmp_path):
    specs = bugged.write(tmp_path, f"confirm_{name}", [name])
    sys.path.insert(0, str(tmp_path))
    try:
        module, _, cls = specs[name].partition(":")
        bug = getattr(__import__(module), cls)
        h = resimkit.record_with(bug, scenario, tiny_model, tmp_path / "rec")
        (broken_at, rid), *_ = h.scheduler.broken  # the schedule() call the bug changed
        recorded = _found(tmp_path / "rec")
        assert invariant in {i for i, _, _ in recorded}, recorded

        fixed = replay.resim(tmp_path / "rec", out=tmp_path / "fixed")
        list(fixed)
        s = fixed.summary
        assert not s.identical and s.first.step == broken_at and s.first.request == rid, (
            s.first.difference)
        assert s.recorded.errors == 0, s.recorded.findings

        again = replay.resim(tmp_path / "rec", scheduler_cls=specs[name],
                             out=tmp_path / "again")
        list(again)
        assert again.summary.identical, again.summary.first.difference
        assert _found(tmp_path / "again") == recorded
    finally:
        sys.path.remove(str(tmp_path))
