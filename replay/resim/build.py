"""A fresh scheduler built from what the manifest records of the engine (recorder/engine_info.py):
no model weights, no worker. vLLM is imported inside functions only (the layering rules)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_contract.errors import TraceError

_STOCK = "vllm.v1.core.sched.scheduler:Scheduler"
_ASYNC = "vllm.v1.core.sched.async_scheduler:AsyncScheduler"
# manifest `engine` keys an override may set
SETTINGS = ("model", "dtype", "max_model_len", "seed", "block_size", "enable_prefix_caching",
            "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs", "chunked_prefill")


@dataclass
class Built:
    scheduler: Any
    cls_name: str  # module:Class
    block_hasher: Any  # None without prefix caching
    settings: dict  # the manifest's engine settings, overrides applied


def settings_of(engine, overrides: dict | None) -> dict:
    e = dict(engine.manifest.get("engine") or {})
    for k, v in (overrides or {}).items():
        if k not in SETTINGS:
            raise TraceError(f"unknown setting {k!r}: resim can set {', '.join(SETTINGS)}")
        e[k] = v
    policy = e.get("policy") or e.get("scheduling_policy")
    if policy and str(policy).lower() != "fcfs":
        raise TraceError(f"the trace was recorded with the {policy} scheduling policy: "
                         "requests' priorities and arrival times are not in the trace, so a "
                         "re-run cannot order the queue as it was")
    spec = e.get("speculative")
    if spec and spec.get("method") != "ngram":
        raise TraceError(f"the trace was recorded with speculative method {spec.get('method')}: "
                         "resim builds ngram speculation only (a drafter needs its model)")
    if not e.get("model"):
        raise TraceError("the trace's manifest names no model: resim needs its config "
                         "(give one with --set model=PATH)")
    if not Path(e["model"]).exists():
        raise TraceError(f"model {e['model']} (named by the trace's manifest) does not exist "
                         "here: resim reads its config, not its weights; point at a copy with "
                         "--set model=PATH")
    return e


def scheduler_class(name: str | None, engine, in_flight: int) -> tuple[type, str]:
    """`module:Class` as given, else the installed vLLM's: AsyncScheduler where the recording
    used it or had batches in flight, else Scheduler."""
    if name is None:
        recorded = (engine.manifest.get("engine") or {}).get("scheduler_class") or ""
        asynced = (recorded.endswith(".AsyncScheduler") or in_flight > 1
                   or bool((engine.manifest.get("engine") or {}).get("async_scheduling")))
        name = _ASYNC if asynced else _STOCK
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise TraceError(f"--scheduler-cls {name!r}: expected module:Class")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except Exception as e:  # any failure to import is the user's input, said in one line
        raise TraceError(f"scheduler class {name} is not importable: {type(e).__name__}: {e}"
                         ) from None
    from vllm.v1.core.sched.scheduler import Scheduler

    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise TraceError(f"{name} is not a subclass of vLLM's Scheduler")
    return cls, name


def build(e: dict, cls: type, cls_name: str, structured: bool) -> Built:
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    spec = e.get("speculative")
    if spec:
        # the n-gram lengths are the drafter's (worker side): the scheduler reads only the count
        spec = {"method": "ngram", "num_speculative_tokens": spec["num_speculative_tokens"],
                "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    dtype = str(e.get("dtype") or "auto").removeprefix("torch.")
    block_size = int(e["block_size"])
    kw = {k: e[k] for k in ("max_model_len", "max_num_batched_tokens", "max_num_seqs",
                            "enable_prefix_caching") if e.get(k) is not None}
    args = EngineArgs(model=str(e["model"]), skip_tokenizer_init=not structured,
                      block_size=block_size, enable_chunked_prefill=bool(
                          e.get("chunked_prefill", True)),
                      dtype=dtype, seed=int(e.get("seed") or 0), speculative_config=spec,
                      enforce_eager=True, **kw)
    try:
        vc = args.create_engine_config()
    except Exception as ex:  # vLLM's own message about the model or the settings, one line
        raise TraceError(f"vLLM cannot build the recorded engine config: {type(ex).__name__}: "
                         f"{ex}") from None
    blocks = int(e["num_kv_blocks"])
    vc.cache_config.num_gpu_blocks = blocks
    # The trace keeps the block count, not the KV groups' layout: one full-attention group,
    # whose head shape the scheduler never reads.
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=block_size, num_kv_heads=1,
                                                      head_size=16, dtype=torch.float32))])
    sched = cls(vllm_config=vc, kv_cache_config=kv,
                structured_output_manager=StructuredOutputManager(vc), block_size=block_size,
                log_stats=False)
    hasher = None
    if vc.cache_config.enable_prefix_caching:
        fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
        init_none_hash(fn)
        hasher = get_request_block_hasher(block_size, fn)
    return Built(sched, cls_name, hasher, e)
