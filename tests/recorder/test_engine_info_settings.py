"""The manifest's `engine` records the settings a re-run needs (issue 30 §1): read from the real
scheduler the rig recorded with, each equal to that scheduler's own config; a setting another
vLLM version lacks is null, never an exception in the engine; older manifests stay readable."""

from __future__ import annotations

import json

import pytest

from vllm_contract import manifest as manifest_mod
from vllm_contract.errors import TraceError
from vllm_contract.recorder.engine_info import SCHEDULER_KEYS, engine_settings
from vllm_contract.rig import scenarios
from vllm_contract.trace import open_trace


def _engine(path) -> dict:
    (eng,) = open_trace(path).engines
    return eng.manifest["engine"]


def test_a_rig_recording_has_the_scheduling_settings_of_its_config(tiny_model, tmp_path):
    h = scenarios.run("chunked_prefill", tiny_model, tmp_path / "t")
    e = _engine(tmp_path / "t")
    sched, cache = h.vllm_config.scheduler_config, h.vllm_config.cache_config
    assert e["policy"] == sched.policy == "fcfs"
    assert e["long_prefill_token_threshold"] == sched.long_prefill_token_threshold == 0
    assert e["long_prefill_token_threshold_adaptive"] is False
    assert e["max_num_scheduled_tokens"] == sched.max_num_scheduled_tokens
    assert e["max_num_active_seqs"] == sched.max_num_active_seqs
    assert e["watermark"] == sched.watermark
    assert e["scheduler_reserve_full_isl"] is sched.scheduler_reserve_full_isl
    assert e["disable_chunked_mm_input"] is sched.disable_chunked_mm_input
    # vLLM 0.32 has no partial-prefill limits: recorded as unknown
    assert e["max_num_partial_prefills"] is None and e["max_long_partial_prefills"] is None
    assert e["prefix_caching_hash_algo"] == cache.prefix_caching_hash_algo == "sha256"
    assert e["scheduler_block_size"] == e["hash_block_size"] == h.config.block_size == 16
    # the rig's one full-attention group: its spec's fields as the scheduler has them, no
    # layer names (only the worker reads those)
    [g] = e["kv_cache_groups"]
    spec = h.scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    assert g["layers"] == 1 and g["spec"] == "FullAttentionSpec" and g["kind"] == "full"
    assert (g["block_size"], g["num_kv_heads"], g["head_size"], g["dtype"]) == (
        spec.block_size, spec.num_kv_heads, spec.head_size, str(spec.dtype).removeprefix("torch."))
    assert "layer_names" not in g and "layer" not in g.values()
    json.dumps(e, allow_nan=False)  # plain JSON


def test_a_setting_the_engine_lacks_is_null_not_an_error(tiny_model):
    """As on another vLLM version: the real scheduler with its scheduler config gone, and a KV
    cache config whose groups cannot be read."""
    from vllm_contract.rig.harness import Harness

    h = Harness(tiny_model)
    object.__setattr__(h.vllm_config, "scheduler_config", None)
    h.scheduler.kv_cache_config.kv_cache_groups = None  # not iterable
    e = engine_settings(h.scheduler)
    assert all(e[k] is None for k in SCHEDULER_KEYS)
    assert e["kv_cache_groups"] is None
    assert e["prefix_caching_hash_algo"] == "sha256" and e["num_kv_blocks"] == h.config.num_blocks


def test_older_manifests_without_the_keys_stay_readable_and_bad_types_are_refused():
    old = {"format_version": 2, "closed_cleanly": True,
           "engine": {"model": "m", "block_size": 16, "num_kv_blocks": 8}}
    manifest_mod.validate(old)
    new = {**old, "engine": {**old["engine"], "policy": "fcfs", "watermark": 0.0,
                             "max_num_partial_prefills": None,
                             "kv_cache_groups": [{"layers": 2, "spec": "SlidingWindowSpec",
                                                  "block_size": 16, "sliding_window": 64}]}}
    manifest_mod.validate(new)
    bad = {**old, "engine": {**old["engine"], "kv_cache_groups": [{"block_size": "16"}]}}
    with pytest.raises(TraceError, match=r"engine\.kv_cache_groups\[0\]\.block_size"):
        manifest_mod.validate(bad)
    with pytest.raises(TraceError, match=r"engine\.long_prefill_token_threshold"):
        manifest_mod.validate({**old, "engine": {"long_prefill_token_threshold": -1}})
