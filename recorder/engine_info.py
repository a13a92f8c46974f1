"""What a replay needs to know about the engine, read from a scheduler's VllmConfig."""

from __future__ import annotations

from typing import Any


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if obj is None:
            return default
        obj = getattr(obj, name, None)
    return default if obj is None else obj


def engine_settings(scheduler: Any) -> dict:
    cfg = getattr(scheduler, "vllm_config", None)
    model = _get(cfg, "model_config")
    sched = _get(cfg, "scheduler_config")
    cache = _get(cfg, "cache_config")
    par = _get(cfg, "parallel_config")
    spec = _get(cfg, "speculative_config")
    kv = getattr(scheduler, "kv_cache_config", None)
    return {
        "model": _get(model, "model"),
        "dtype": str(_get(model, "dtype")),
        "max_model_len": _get(model, "max_model_len"),
        "seed": _get(model, "seed"),
        "block_size": _get(cache, "block_size") or getattr(scheduler, "block_size", None),
        "enable_prefix_caching": _get(cache, "enable_prefix_caching"),
        "num_kv_blocks": _get(kv, "num_blocks"),
        "max_num_batched_tokens": _get(sched, "max_num_batched_tokens"),
        "max_num_seqs": _get(sched, "max_num_seqs"),
        "chunked_prefill": _get(sched, "enable_chunked_prefill"),
        "async_scheduling": _get(sched, "async_scheduling"),
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
    }


def dp_rank(scheduler: Any) -> int:
    return int(_get(scheduler, "vllm_config", "parallel_config", "data_parallel_rank", default=0))


def model_on_cpu(scheduler: Any) -> bool:
    """Whether the engine runs its model on the CPU (vLLM's CPU build): its OpenMP threads then
    keep every core busy, and whatever CPU the recorder spends comes out of the model's."""
    return _get(scheduler, "vllm_config", "device_config", "device_type") == "cpu"
