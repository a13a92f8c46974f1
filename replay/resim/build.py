"""A fresh scheduler built from what the manifest records of the engine (recorder/engine_info.py):
no model weights, no worker. vLLM is imported inside functions only (the layering rules)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from vllm_contract.errors import TraceError
from vllm_contract.replay.resim import log

_STOCK = "vllm.v1.core.sched.scheduler:Scheduler"
_ASYNC = "vllm.v1.core.sched.async_scheduler:AsyncScheduler"
# recorded settings handed to EngineArgs under the same name, where the installed vLLM has it
# (the partial-prefill limits are older versions'); absent from older manifests: vLLM's defaults
APPLIED = ("long_prefill_token_threshold", "long_prefill_token_threshold_adaptive",
           "max_num_partial_prefills", "max_long_partial_prefills", "max_num_scheduled_tokens",
           "max_num_active_seqs", "watermark", "scheduler_reserve_full_isl",
           "disable_chunked_mm_input", "prefix_caching_hash_algo")
# manifest `engine` keys an override may set: the cache and scheduler settings a re-run builds
SETTINGS = ("model", "dtype", "max_model_len", "seed", "block_size", "enable_prefix_caching",
            "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs", "chunked_prefill",
            "policy", *APPLIED)
# vLLM's names for a setting the manifest keeps under another (cache_config.num_gpu_blocks)
ALIASES = {"num_gpu_blocks": "num_kv_blocks", "enable_chunked_prefill": "chunked_prefill"}
# the KV cache group specs a re-run builds: their block managers need only the block size and
# the window; the others hold state (Mamba) or layouts (MLA, sparse) the manifest does not keep
GROUP_SPECS = ("FullAttentionSpec", "SlidingWindowSpec", "ChunkedLocalAttentionSpec")


@dataclass
class Built:
    scheduler: Any
    cls_name: str  # module:Class
    block_hasher: Any  # None without prefix caching
    settings: dict  # the manifest's engine settings, overrides applied
    # settings the manifest does not record (an older recorder), so vLLM's defaults
    unrecorded: list[str] = field(default_factory=list)


def named(overrides: dict | None) -> dict:
    """The overrides under the manifest's names (ALIASES)."""
    return {ALIASES.get(k, k): v for k, v in (overrides or {}).items()}


def settings_of(engine, overrides: dict | None) -> dict:
    e = dict(engine.manifest.get("engine") or {})
    if "max_num_scheduled_tokens" in e and (
            e["max_num_scheduled_tokens"] == e.get("max_num_batched_tokens")):
        # vLLM's derived value, not a setting: derived anew from an overridden budget
        e["max_num_scheduled_tokens"] = None
    overrides = named(overrides)
    for k, v in overrides.items():
        if k not in SETTINGS:
            raise TraceError(f"unknown setting {k!r}: resim can set {', '.join(SETTINGS)} "
                             f"({', '.join(f'{a} for {b}' for a, b in ALIASES.items())})")
        e[k] = v
    if "block_size" in overrides:
        _rescale_blocks(e, (engine.manifest.get("engine") or {}).get("block_size"))
    policy = e.get("policy")
    if policy and str(policy).lower() != "fcfs" and not log.has_log(engine):
        raise TraceError(f"the trace was recorded with the {policy} scheduling policy: "
                         "requests' priorities and arrival times are not in a trace of this "
                         "format (no input log), so a re-run cannot order the queue as it was")
    for i, g in enumerate(e.get("kv_cache_groups") or []):
        if g.get("spec") not in GROUP_SPECS:
            raise TraceError(f"KV cache group {i} of the trace is a {g.get('spec')}: resim "
                             f"builds {', '.join(GROUP_SPECS)} groups only")
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


def _rescale_blocks(e: dict, recorded: Any) -> None:
    """An overridden block size: the groups that had the recorded one take it, and the
    scheduler's block sizes are derived anew, as vLLM derives them."""
    e.pop("scheduler_block_size", None)
    e.pop("hash_block_size", None)
    if e.get("kv_cache_groups"):
        e["kv_cache_groups"] = [{**g, "block_size": e["block_size"]}
                                if g.get("block_size") == recorded else g
                                for g in e["kv_cache_groups"]]


def not_applied(keys) -> list[str]:
    """The APPLIED settings among `keys` that the installed vLLM's EngineArgs lacks."""
    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in fields(EngineArgs)}
    return [k for k in keys if k in APPLIED and k not in known]


def _engine_args(e: dict, structured: bool) -> tuple[Any, list[str]]:
    """EngineArgs for the recorded settings, and the APPLIED ones the manifest lacks."""
    from vllm.engine.arg_utils import EngineArgs

    spec = e.get("speculative")
    if spec:
        # the n-gram lengths are the drafter's (worker side): the scheduler reads only the count
        spec = {"method": "ngram", "num_speculative_tokens": spec["num_speculative_tokens"],
                "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    dtype = str(e.get("dtype") or "auto").removeprefix("torch.")
    known = {f.name for f in fields(EngineArgs)}
    kw = {k: e[k] for k in ("max_model_len", "max_num_batched_tokens", "max_num_seqs",
                            "enable_prefix_caching", *APPLIED)
          if e.get(k) is not None and k in known}
    unrecorded = [k for k in ("policy", *(a for a in APPLIED if a in known)) if k not in e]
    if not e.get("kv_cache_groups"):  # absent, or unreadable on the recording's vLLM
        unrecorded.append("kv_cache_groups")
    args = EngineArgs(model=str(e["model"]), skip_tokenizer_init=not structured,
                      block_size=int(e["block_size"]), enable_chunked_prefill=bool(
                          e.get("chunked_prefill", True)),
                      dtype=dtype, seed=int(e.get("seed") or 0), speculative_config=spec,
                      enforce_eager=True, **kw)
    return args, unrecorded


def _kv_config(e: dict, vc: Any) -> Any:
    """The recorded KV cache groups, or for an older manifest one full-attention group; no
    head shapes (the scheduler never reads them) and no tensors (no worker)."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    recorded = e.get("kv_cache_groups") or [
        {"layers": 1, "spec": "FullAttentionSpec", "block_size": int(e["block_size"])}]
    groups = []
    for i, g in enumerate(recorded):
        extra = {k: g[k] for k in ("sliding_window", "attention_chunk_size") if g.get(k)}
        try:
            if g.get("spec") not in GROUP_SPECS:
                raise TypeError(f"resim builds {', '.join(GROUP_SPECS)} groups only")
            spec = getattr(kvi, g["spec"])(block_size=int(g["block_size"]), num_kv_heads=1,
                                           head_size=16, dtype=torch.float32, **extra)
        except Exception as ex:  # a group the manifest describes short of what vLLM needs
            raise TraceError(f"KV cache group {i} ({g.get('spec')}) cannot be built: "
                             f"{type(ex).__name__}: {ex}") from None
        groups.append(kvi.KVCacheGroupSpec(
            [f"group{i}.layer{j}" for j in range(max(1, int(g.get("layers") or 1)))], spec))
    retention = (e["prefix_cache_retention_interval"] if "prefix_cache_retention_interval" in e
                 else getattr(vc.cache_config, "prefix_cache_retention_interval", None))
    return kvi.KVCacheConfig(num_blocks=int(e["num_kv_blocks"]), kv_cache_tensors=[],
                             kv_cache_groups=groups, prefix_cache_retention_interval=retention)


def start_from(scheduler: Any, kv_at_start: dict | None) -> list[str]:
    """Put the recorded free-block order (an engine that had run before the recording) in
    the new scheduler's block pool; the notes on what cannot be."""
    if not kv_at_start or kv_at_start.get("fresh") or not kv_at_start.get("free_blocks"):
        return []
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    pool = scheduler.kv_cache_manager.block_pool
    order = kv_at_start["free_blocks"]
    if sorted(order) != list(range(1, pool.num_gpu_blocks)):
        return ["the recording's free KV blocks at its start do not fit the re-run's block "
                "pool: the re-run starts from a new engine's order"]
    pool.free_block_queue = FreeKVCacheBlockQueue([pool.blocks[i] for i in order])
    notes = ["the recording began on an engine that had run before: the re-run's block "
             "pool starts in its recorded free order"]
    if kv_at_start.get("cached_blocks"):
        notes.append(f"{kv_at_start['cached_blocks']:,} KV blocks held prefixes cached before "
                     "the recording: a cache hit on one is not re-run (the re-run starts with "
                     "an empty cache)")
    return notes


def build(e: dict, cls: type, cls_name: str, structured: bool) -> Built:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import (get_request_block_hasher, init_none_hash,
                                             resolve_kv_cache_block_sizes)
    from vllm.v1.structured_output import StructuredOutputManager

    args, unrecorded = _engine_args(e, structured)
    try:
        vc = args.create_engine_config()
    except Exception as ex:  # vLLM's own message about the model or the settings, one line
        raise TraceError(f"vLLM cannot build the recorded engine config: {type(ex).__name__}: "
                         f"{ex}") from None
    vc.cache_config.num_gpu_blocks = int(e["num_kv_blocks"])
    if e.get("policy"):  # refused without an input log (settings_of)
        vc.scheduler_config.policy = e["policy"]
    kv = _kv_config(e, vc)
    try:
        block_size, hash_block_size = resolve_kv_cache_block_sizes(kv, vc)
        # the recorded ones where the manifest has them: a prefix_match_unit the trace does not
        # keep decides the hash block size of several groups
        block_size = int(e.get("scheduler_block_size") or block_size)
        hash_block_size = int(e.get("hash_block_size") or hash_block_size)
        sched = cls(vllm_config=vc, kv_cache_config=kv,
                    structured_output_manager=StructuredOutputManager(vc), block_size=block_size,
                    hash_block_size=hash_block_size, log_stats=False)
    except (ValueError, AssertionError) as ex:  # vLLM refusing the recorded KV layout
        raise TraceError(f"the scheduler cannot be built from the recorded settings: "
                         f"{type(ex).__name__}: {ex}") from None
    hasher = None
    if vc.cache_config.enable_prefix_caching:
        fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
        init_none_hash(fn)
        hasher = get_request_block_hasher(hash_block_size, fn)
    return Built(sched, cls_name, hasher, e, unrecorded)
