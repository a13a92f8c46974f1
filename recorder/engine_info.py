"""What a replay needs to know about the engine, read from a scheduler's VllmConfig."""

from __future__ import annotations

from typing import Any

from vllm_contract.kv_groups import group_kind

# scheduler_config fields that decide what schedule() schedules (vLLM 0.32). The partial-prefill
# limits are older versions' (absent here: None).
SCHEDULER_KEYS = ("policy", "long_prefill_token_threshold",
                  "long_prefill_token_threshold_adaptive", "max_num_partial_prefills",
                  "max_long_partial_prefills", "max_num_scheduled_tokens", "max_num_active_seqs",
                  "watermark", "scheduler_reserve_full_isl", "disable_chunked_mm_input")


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    # Any exception, not only AttributeError: a property of another vLLM version that raises
    # must cost the engine a None in the manifest, never its start.
    for name in names:
        if obj is None:
            return default
        try:
            obj = getattr(obj, name, None)
        except Exception:
            return default
    return default if obj is None else obj


def _plain(v: Any) -> Any:
    """A JSON scalar: an enum or a Literal subclass of another version becomes its str."""
    return v if v is None or type(v) in (bool, int, float, str) else str(v)


def _field_value(v: Any) -> Any:
    """A spec field as JSON: numbers and strings as they are, a dtype or enum by name, shapes as
    lists; None for what has no plain form."""
    if v is None or type(v) in (bool, int, float, str):
        return v
    if isinstance(v, (tuple, list)):
        items = [_field_value(x) for x in v]
        return None if any(x is None and y is not None for x, y in zip(items, v)) else items
    name = getattr(v, "name", None)  # an Enum member
    if isinstance(name, str) and not callable(name):
        return name
    text = str(v)
    return text.removeprefix("torch.") if text.startswith("torch.") else None


def _groups(kv: Any) -> list[dict] | None:
    """The KV cache groups, small: the spec's class, its rules' kind and every plain field of it
    (block size, window, chunk, a Mamba group's cache mode, speculative blocks, state shapes and
    dtypes), not the layers' names, which only the worker reads."""
    import dataclasses

    try:
        groups = []
        for g in kv.kv_cache_groups:
            spec = g.kv_cache_spec
            row = {"layers": len(g.layer_names), "spec": type(spec).__name__,
                   "kind": group_kind(type(spec).__name__),
                   "block_size": _plain(_get(spec, "block_size"))}
            if dataclasses.is_dataclass(spec):
                for f in dataclasses.fields(spec):
                    if f.name in row:
                        continue
                    try:
                        value = _field_value(getattr(spec, f.name))
                    except Exception:  # a property of another version that raises
                        value = None
                    if value is not None:
                        row[f.name] = value
            groups.append(row)
        return groups
    except Exception:  # another version's layout: the manifest says unknown, the engine runs
        return None


def engine_settings(scheduler: Any) -> dict:
    cfg = _get(scheduler, "vllm_config")
    model = _get(cfg, "model_config")
    sched = _get(cfg, "scheduler_config")
    cache = _get(cfg, "cache_config")
    par = _get(cfg, "parallel_config")
    spec = _get(cfg, "speculative_config")
    kv = _get(scheduler, "kv_cache_config")
    return {
        "model": _get(model, "model"),
        "dtype": str(_get(model, "dtype")),
        "max_model_len": _get(model, "max_model_len"),
        "seed": _get(model, "seed"),
        "block_size": _get(cache, "block_size") or _get(scheduler, "block_size"),
        "enable_prefix_caching": _get(cache, "enable_prefix_caching"),
        "num_kv_blocks": _get(kv, "num_blocks"),
        "max_num_batched_tokens": _get(sched, "max_num_batched_tokens"),
        "max_num_seqs": _get(sched, "max_num_seqs"),
        "chunked_prefill": _get(sched, "enable_chunked_prefill"),
        "async_scheduling": _get(sched, "async_scheduling"),
        # what else Scheduler.__init__ and schedule() read from the config and decide with
        **{k: _plain(_get(sched, k)) for k in SCHEDULER_KEYS},
        "prefix_caching_hash_algo": _plain(_get(cache, "prefix_caching_hash_algo")),
        # how Mamba groups keep state blocks (none, align, all): the scheduler's chunking and
        # the groups' block rules follow it
        "mamba_cache_mode": _plain(_get(cache, "mamba_cache_mode")),
        # the scheduler's own block sizes: with several groups, not cache_config.block_size
        "scheduler_block_size": _plain(_get(scheduler, "block_size")),
        "hash_block_size": _plain(_get(scheduler, "hash_block_size")),
        "prefix_cache_retention_interval": _plain(_get(kv, "prefix_cache_retention_interval")),
        "kv_cache_groups": None if kv is None else _groups(kv),
        "speculative": None if spec is None else {
            "method": _get(spec, "method"),
            "num_speculative_tokens": _get(spec, "num_speculative_tokens"),
        },
        "parallel": {
            "tensor_parallel_size": _get(par, "tensor_parallel_size", default=1),
            "pipeline_parallel_size": _get(par, "pipeline_parallel_size", default=1),
            "data_parallel_size": _get(par, "data_parallel_size", default=1),
        },
        "scheduler_class": f"{type(scheduler).__module__}.{type(scheduler).__qualname__}",
        # what a re-run cannot reproduce: a connector's transfers, a pooling model's outputs
        "kv_connector": _plain(_get(cfg, "kv_transfer_config", "kv_connector")),
        "runner_type": _plain(_get(model, "runner_type")),
    }



def dp_rank(scheduler: Any) -> int:
    return int(_get(scheduler, "vllm_config", "parallel_config", "data_parallel_rank", default=0))


def model_on_cpu(scheduler: Any) -> bool:
    """Whether the engine runs its model on the CPU (vLLM's CPU build): its OpenMP threads then
    keep every core busy, and whatever CPU the recorder spends comes out of the model's."""
    return _get(scheduler, "vllm_config", "device_config", "device_type") == "cpu"
