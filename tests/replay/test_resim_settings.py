"""`resim` builds the scheduler with the settings the manifest records (issue 30 §1): a recording
made with a non-default long_prefill_token_threshold re-runs identically, and diverges once the
manifest forgets it (the setting decides); a recorded priority policy and a KV cache group the
installed vLLM cannot build are refused in one line; recorded groups, Mamba ones too, are built
as recorded."""

from __future__ import annotations

import json
import shutil

import pytest

from vllm_contract import replay
from vllm_contract.errors import TraceError
from vllm_contract.rig import scenarios

import resimkit

THRESHOLD = 16  # below the rig's 64-token budget: each of 3 long prompts prefills 16 at a time


@pytest.fixture(scope="module")
def threshold_trace(tiny_model, tmp_path_factory):
    """chunked_prefill with long_prefill_token_threshold set on the rig's own scheduler config
    (HarnessConfig has no such field): the scheduler reads it at every schedule()."""
    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness

    s = scenarios.SCENARIOS["chunked_prefill"]
    h = Harness(tiny_model, s.config)
    h.vllm_config.scheduler_config.long_prefill_token_threshold = THRESHOLD
    path = tmp_path_factory.mktemp("threshold") / "t"
    with attach(h.scheduler, path):
        s.drive(h)
    return path


def _copy_editing(trace, dest, edit):
    shutil.copytree(trace, dest)
    (m,) = dest.glob("_engines/*/manifest.json")
    manifest = json.loads(m.read_text())
    edit(manifest["engine"])
    m.write_text(json.dumps(manifest))
    return dest


def _run(trace, **kw):
    run = replay.resim(trace, **kw)
    results = list(run)
    return run, run.summary, results


def test_a_recorded_threshold_re_runs_identically(threshold_trace):
    run, summary, results = _run(threshold_trace)
    assert run.scheduler.scheduler_config.long_prefill_token_threshold == THRESHOLD
    assert summary.first is None, summary.first.difference
    assert summary.identical_steps == summary.steps == len(results) > 0
    assert run.built.unrecorded == []
    assert not [n for n in summary.notes if n.startswith("not recorded")]


def test_without_the_recorded_threshold_the_re_run_diverges(threshold_trace, tmp_path):
    forgot = _copy_editing(threshold_trace, tmp_path / "old",
                           lambda e: e.pop("long_prefill_token_threshold"))
    run, summary, _ = _run(forgot)
    assert run.scheduler.scheduler_config.long_prefill_token_threshold == 0  # vLLM's default
    assert run.built.unrecorded == ["long_prefill_token_threshold"]
    assert "not recorded, so vLLM's defaults: long_prefill_token_threshold" in summary.notes
    f = summary.first
    assert f is not None and f.step == 0 and f.field == "num_scheduled_tokens"
    assert f.difference == (f"step 0: the recording scheduled {f.request} for {THRESHOLD} "
                            f"tokens; the re-run scheduled it for 64")


def test_a_scheduler_setting_and_vllms_own_names_can_be_overridden(threshold_trace):
    """--set reaches the scheduler config (the threshold set back to vLLM's default makes the
    same first divergence as a manifest that forgot it) and takes vLLM's names for the
    manifest's (num_gpu_blocks is num_kv_blocks)."""
    run, summary, _ = _run(threshold_trace, overrides={"long_prefill_token_threshold": 0})
    assert run.scheduler.scheduler_config.long_prefill_token_threshold == 0
    f = summary.first
    assert f is not None and f.step == 0 and f.field == "num_scheduled_tokens"
    assert f.difference.endswith("; the re-run scheduled it for 64")
    run, summary, _ = _run(threshold_trace, overrides={"num_gpu_blocks": 40})
    assert run.scheduler.kv_cache_manager.block_pool.num_gpu_blocks == 40
    assert "settings overridden: num_kv_blocks=40" in summary.notes
    with pytest.raises(TraceError, match=r"unknown setting 'num_gpu_blockz'.*num_gpu_blocks "
                                         r"for num_kv_blocks"):
        replay.resim(threshold_trace, overrides={"num_gpu_blockz": 4})


def test_a_priority_recording_and_an_unbuildable_group_are_refused(threshold_trace, tmp_path):
    # priorities are in the input log: refused where a trace has none
    old = resimkit.without_input_log(threshold_trace, tmp_path / "old")
    prio = _copy_editing(old, tmp_path / "prio", lambda e: e.update(policy="priority"))
    with pytest.raises(TraceError, match="recorded with the priority scheduling policy"):
        replay.resim(prio)
    # a spec class the installed vLLM does not have
    unknown = _copy_editing(threshold_trace, tmp_path / "unknown", lambda e: e["kv_cache_groups"]
                            .append({"layers": 2, "spec": "NoSuchSpec", "block_size": 16}))
    with pytest.raises(TraceError) as err:
        replay.resim(unknown)
    assert str(err.value) == ("KV cache group 1 of the trace cannot be rebuilt: the installed "
                              "vLLM has no KV cache spec class NoSuchSpec")
    # a required field with no harmless stand-in (the window decides which blocks are freed)
    windowless = _copy_editing(threshold_trace, tmp_path / "windowless",
                               lambda e: e["kv_cache_groups"].append(
                                   {"layers": 2, "spec": "SlidingWindowSpec", "block_size": 16}))
    with pytest.raises(TraceError) as err:
        replay.resim(windowless)
    assert str(err.value) == ("KV cache group 1 of the trace (SlidingWindowSpec) cannot be "
                              "rebuilt: the manifest does not record its sliding_window")
    # a recorded value the installed class cannot take
    bad = _copy_editing(threshold_trace, tmp_path / "bad", lambda e: e["kv_cache_groups"]
                        .append({"layers": 1, "spec": "MambaSpec", "block_size": 16,
                                 "shapes": [[4, 32]], "dtypes": ["no_such_dtype"]}))
    with pytest.raises(TraceError) as err:
        replay.resim(bad)
    assert str(err.value).startswith("KV cache group 1 of the trace (MambaSpec) cannot be "
                                     "rebuilt: TypeError: dtypes=")
    assert "\n" not in str(err.value)


def test_a_mamba_group_is_rebuilt_from_its_recorded_fields(threshold_trace, tmp_path):
    """Every recorded field of the spec is decoded (shapes as tuples, dtypes and enums by
    name), and the Mamba cache mode reaches the scheduler: the group's own where the engine's
    setting is not recorded."""
    import torch
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    def add_mamba(e):
        e.pop("mamba_cache_mode", None)
        e["kv_cache_groups"].append(
            {"layers": 2, "spec": "MambaSpec", "kind": "mamba", "block_size": 16,
             "shapes": [[3, 288], [8, 32, 16]], "dtypes": ["bfloat16", "float32"],
             "mamba_type": "MAMBA2", "mamba_cache_mode": "align",
             "num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1,
             "page_size_padded": 32768, "no_such_field_here": 7})

    mamba = _copy_editing(threshold_trace, tmp_path / "mamba", add_mamba)
    run = replay.resim(mamba)
    coordinator = run.scheduler.kv_cache_manager.coordinator
    assert [type(m).__name__ for m in coordinator.single_type_managers] == [
        "FullAttentionManager", "MambaManager"]
    manager = coordinator.single_type_managers[1]
    assert isinstance(manager, MambaManager)
    spec = run.scheduler.kv_cache_config.kv_cache_groups[1].kv_cache_spec
    assert spec.shapes == ((3, 288), (8, 32, 16))
    assert spec.dtypes == (torch.bfloat16, torch.float32)
    assert spec.mamba_type.name == "MAMBA2" and spec.mamba_cache_mode == "align"
    assert (spec.num_prefill_checkpoint_blocks, spec.prefill_checkpoint_alignment,
            spec.page_size_padded) == (1, 1, 32768)
    assert run.scheduler.cache_config.mamba_cache_mode == "align"
    assert run.scheduler.need_mamba_block_aligned_split
    # the engine's recorded setting is the one the scheduler read
    plain = _copy_editing(mamba, tmp_path / "plain",
                          lambda e: e.update(mamba_cache_mode="none"))
    run = replay.resim(plain)
    assert run.scheduler.cache_config.mamba_cache_mode == "none"
    assert not run.scheduler.need_mamba_block_aligned_split


def test_recorded_kv_cache_groups_are_built_as_recorded(threshold_trace, tmp_path):
    hybrid = _copy_editing(threshold_trace, tmp_path / "hybrid", lambda e: e["kv_cache_groups"]
                           .append({"layers": 2, "spec": "SlidingWindowSpec", "block_size": 16,
                                    "sliding_window": 32}))
    run = replay.resim(hybrid)
    coordinator = run.scheduler.kv_cache_manager.coordinator
    assert [type(m).__name__ for m in coordinator.single_type_managers] == [
        "FullAttentionManager", "SlidingWindowManager"]
    assert [len(g.layer_names) for g in run.scheduler.kv_cache_config.kv_cache_groups] == [1, 2]
    assert coordinator.single_type_managers[1].sliding_window == 32
    full, sliding = (g.kv_cache_spec for g in run.scheduler.kv_cache_config.kv_cache_groups)
    # the recorded head shape (the rig's), and for a group recorded without one (an older
    # manifest) a harmless stand-in
    assert (full.num_kv_heads, full.head_size, str(full.dtype)) == (2, 32, "torch.bfloat16")
    assert (sliding.num_kv_heads, sliding.head_size, str(sliding.dtype)) == (
        1, 16, "torch.float32")


def test_what_a_re_run_cannot_reproduce_is_named_in_one_note(threshold_trace, tmp_path):
    """The manifest records the engine's KV connector and runner type (none and generate on the
    rig's engine: no note); a recording with a connector and a pooling runner is re-run with
    one note naming both. The connector and runner are written into a copy of the manifest:
    the CPU build here runs neither."""
    (m,) = threshold_trace.glob("_engines/*/manifest.json")
    engine = json.loads(m.read_text())["engine"]
    assert engine["kv_connector"] is None and engine["runner_type"] == "generate"
    _, summary, _ = _run(threshold_trace)
    assert not [n for n in summary.notes if n.startswith("not reproduced")]
    other = _copy_editing(threshold_trace, tmp_path / "nixl",
                          lambda e: e.update(kv_connector="NixlConnector",
                                             runner_type="pooling"))
    _, summary, _ = _run(other)
    (note,) = [n for n in summary.notes if n.startswith("not reproduced")]
    assert "the KV connector's transfers (NixlConnector)" in note and "pooling outputs" in note
