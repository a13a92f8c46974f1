"""encoder.freed_while_needed's drafter window (docs/worker-reads.md, "the draft window shift for
MTP") on a real AsyncScheduler run, broken right after schedule() returns.

LOOK-ALIKE: the CPU build has only the ngram drafter, which never reads encoder outputs. The run
is the real AsyncScheduler with ngram drafts (batch_queue=2: two batches in flight, the drafts
sent as placeholders and partly accepted by the fabricated model); the images are stamped on by
the break, and the test then marks the recording's drafter as eagle in its manifest (an edit,
named as such), the one thing the trace cannot show here."""

from __future__ import annotations

from vllm_contract.rig import breaks

from checking import edit_manifest, findings, hits, patched

CHECK = "encoder.freed_while_needed"


def test_free_by_optimistic_count_under_the_drafter(tiny_model, tmp_path):
    broken = patched(tiny_model, tmp_path, "spec_decode", breaks.free_by_optimistic_count(),
                     batch_queue=2)
    # as recorded: an ngram drafter, which gathers no encoder outputs; the frees land only
    # behind the target's windows
    assert hits(findings(tmp_path, [CHECK]), CHECK) == []
    edit_manifest(tmp_path, speculative={"method": "eagle", "num_speculative_tokens": 2})
    report = findings(tmp_path, [CHECK])
    assert hits(report, CHECK) == broken
    (f,) = report.findings
    assert "reads (the drafter, after 2 rejected drafts)" in f.message
