"""`resim` on hybrid recordings: the rig's real vLLM Scheduler over a Mamba group beside a
full-attention group ("align" cache mode with prefix caching; "none" with a 512-token Mamba block
and no prefix caching) and over a sliding-window group beside a full one. The re-run rebuilds
each group from the spec the manifest records, with the recorded Mamba cache mode and scheduler
block sizes, and every step comes out identical."""

from __future__ import annotations

import json
import shutil

import pytest

from vllm_contract import replay
from vllm_contract.rig import scenarios

import resimkit


@pytest.fixture(scope="module")
def recorded(tiny_model, tmp_path_factory):
    """Scenario name -> its recording (each recorded once for the module)."""
    traces = {}

    def get(name):
        if name not in traces:
            path = tmp_path_factory.mktemp(name) / "t"
            scenarios.run(name, tiny_model, str(path))
            traces[name] = path
        return traces[name]

    return get


def _engine(trace):
    (m,) = trace.glob("_engines/*/manifest.json")
    return json.loads(m.read_text())["engine"]


@pytest.mark.parametrize("name, managers, mode, blocks", [
    ("hybrid_mamba", ["MambaManager", "FullAttentionManager"], "align", (16, 16)),
    ("hybrid_mamba_plain", ["MambaManager", "FullAttentionManager"], "none", (512, 16)),
    ("hybrid_sliding", ["SlidingWindowManager", "FullAttentionManager"], "none", (16, 16)),
])
def test_a_hybrid_recording_re_runs_identically(recorded, name, managers, mode, blocks):
    trace = recorded(name)
    engine = _engine(trace)
    assert engine["mamba_cache_mode"] == mode
    assert (engine["scheduler_block_size"], engine["hash_block_size"]) == blocks
    resimkit.assert_re_runs_identically(trace)
    run = replay.resim(trace)
    sched = run.scheduler
    assert [type(m).__name__ for m in sched.kv_cache_manager.coordinator.single_type_managers
            ] == managers
    assert sched.cache_config.mamba_cache_mode == mode
    assert (sched.block_size, sched.hash_block_size) == blocks
    assert sched.need_mamba_block_aligned_split == (mode == "align")
    assert not [n for n in run.notes if n.startswith(("not recorded", "not reproduced"))]


def test_without_the_recorded_mamba_cache_mode_the_re_run_diverges(recorded, tmp_path):
    """The recorded mode decides: a manifest that had none of it leaves vLLM's default for
    the rig's model ("none"), which chunks prefills off the Mamba block boundary."""
    trace = recorded("hybrid_mamba")
    forgot = tmp_path / "forgot"
    shutil.copytree(trace, forgot)
    (m,) = forgot.glob("_engines/*/manifest.json")
    manifest = json.loads(m.read_text())
    manifest["engine"].pop("mamba_cache_mode")
    for g in manifest["engine"]["kv_cache_groups"]:
        g.pop("mamba_cache_mode", None)
    m.write_text(json.dumps(manifest))
    run = replay.resim(forgot)
    list(run)
    assert run.scheduler.cache_config.mamba_cache_mode == "none"
    f = run.summary.first
    assert f is not None and f.step == 0 and f.field == "num_scheduled_tokens", f


def test_an_overridden_block_size_rescales_the_mamba_group(recorded):
    """--set block_size=32: the groups of the recorded size (Mamba "align" and full) take the
    new one and the scheduler's block sizes are derived anew; a what-if run."""
    run = replay.resim(recorded("hybrid_mamba"), overrides={"block_size": 32}, whatif=True)
    list(run)
    sched = run.scheduler
    assert [g.kv_cache_spec.block_size for g in sched.kv_cache_config.kv_cache_groups] == [
        32, 32]
    assert (sched.block_size, sched.hash_block_size) == (32, 32)
    assert type(sched.kv_cache_manager.coordinator.single_type_managers[0]).__name__ == (
        "MambaManager")
    assert run.summary.steps > 0
