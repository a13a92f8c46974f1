"""The hybrid bug classes of rig/breaks.py, each a real hybrid Scheduler run (vLLM's own
sliding-window and Mamba managers, rig's hybrid_* scenarios) whose SchedulerOutput is broken
right after schedule() returns: each is reported at its exact step and request, and by nothing
else that is an error or a warning where the break implies no more."""

from __future__ import annotations

from vllm_contract.rig import breaks

from checking import findings, hits, patched




def test_window_block_handed_on_while_the_window_covers_it(tiny_model, tmp_path):
    """A sliding-window block freed too early and given to a new request: double_owner at
    that request's first step (the clean run of the same scenario is silent:
    test_clean_runs)."""
    broken = patched(tiny_model, tmp_path, "hybrid_sliding", breaks.hand_out_window_block())
    assert hits(findings(tmp_path), "blocks.double_owner") == broken


def test_mamba_state_block_shared(tiny_model, tmp_path):
    """A new request given a running request's current Mamba state block."""
    broken = patched(tiny_model, tmp_path, "hybrid_mamba", breaks.share_mamba_state())
    assert hits(findings(tmp_path), "blocks.double_owner") == broken


def test_null_block_appended_in_the_window(tiny_model, tmp_path):
    """A running request's newest sliding-window block replaced by the null block."""
    broken = patched(tiny_model, tmp_path, "hybrid_sliding", breaks.null_block_in_table())
    assert hits(findings(tmp_path), "blocks.null_needed") == broken


def test_mamba_state_written_to_the_null_block(tiny_model, tmp_path):
    """A running request's Mamba grant ending in the null block: its state goes nowhere."""
    broken = patched(tiny_model, tmp_path, "hybrid_mamba", breaks.null_block_in_table())
    assert hits(findings(tmp_path), "blocks.null_needed") == broken


def test_mamba_group_missed_the_prefix_hit(tiny_model, tmp_path):
    """A new request's computed count includes a prefix hit its Mamba group lost."""
    broken = patched(tiny_model, tmp_path, "hybrid_mamba", breaks.drop_mamba_hit())
    assert hits(findings(tmp_path), "blocks.null_needed") == broken


def test_new_request_sent_one_group_short(tiny_model, tmp_path):
    """The first new request's block_ids lose their last group's list: the worker's add_row
    would raise IndexError."""
    done = []

    def drop_group(so, step):
        for r in so.scheduled_new_reqs:
            if not done:
                r.block_ids = r.block_ids[:-1]
                done.append(r.req_id)
                return step, r.req_id
        return None

    broken = patched(tiny_model, tmp_path, "hybrid_sliding", drop_group)
    assert hits(findings(tmp_path), "blocks.group_count") == broken
