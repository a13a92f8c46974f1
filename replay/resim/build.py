"""A fresh scheduler built from what the manifest records of the engine (recorder/engine_info.py):
no model weights, no worker. vLLM is imported inside functions only (the layering rules)."""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import sys
import types
import typing
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
# A KV cache group's required spec fields that an older manifest does not record: harmless
# values (the scheduler's block managers never read head shapes or state shapes; the worker,
# which does, is not built). The block size defaults to the engine's.
SPEC_DEFAULTS = {"num_kv_heads": 1, "head_size": 16, "dtype": "float32", "shapes": [[1]],
                 "dtypes": ["float32"]}


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
        spec_class(i, g)
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


def spec_class(i: int, g: dict) -> type:
    """The installed vLLM's KV cache spec class that group `i` of the manifest names, else a
    one-line refusal."""
    from vllm.v1 import kv_cache_interface as kvi

    name = g.get("spec")
    cls = getattr(kvi, str(name), None) if name else None
    if not (isinstance(cls, type) and issubclass(cls, kvi.KVCacheSpec)
            and dataclasses.is_dataclass(cls)):
        why = ("the manifest names no spec class" if not name else
               f"the installed vLLM has no KV cache spec class {name}")
        raise TraceError(f"KV cache group {i} of the trace cannot be rebuilt: {why}")
    return cls


def _annotations(cls: type) -> dict[str, Any]:
    """Each dataclass field's type, evaluated in the module that declares it; a union whose
    members are not all importable (names imported for type checking only) keeps those that
    are, and an annotation that cannot be read at all is None."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = sys.modules.get(klass.__module__)
        ns = dict(vars(module)) if module else {}
        for name, ann in (klass.__dict__.get("__annotations__") or {}).items():
            if isinstance(ann, str):
                ann = _evaluated(ann, ns)
            out[name] = ann
    return out


def _evaluated(text: str, ns: dict) -> Any:
    try:
        return eval(text, ns)  # noqa: S307 (a vLLM class's own annotation)
    except Exception:
        pass
    parts = [p.strip() for p in text.split("|")] if "[" not in text else []
    types_ = []
    for p in parts:
        try:
            types_.append(eval(p, ns))  # noqa: S307
        except Exception:
            continue
    return typing.Union[tuple(types_)] if len(types_) > 1 else (types_[0] if types_ else None)


def _decoded(value: Any, tp: Any, name: str) -> Any:
    """A recorded spec field (recorder/engine_info.py, _field_value: a dtype or an enum by
    name, shapes as lists) as the field's type wants it; TypeError where it cannot be."""
    import enum

    import torch

    if value is None:
        return None
    if tp is None or tp is Any:  # an annotation not readable here: by the value's form
        if isinstance(value, list):
            return tuple(_decoded(v, None, name) for v in value)
        if isinstance(value, str) and "dtype" in name:
            dt = getattr(torch, value, None)
            if isinstance(dt, torch.dtype):
                return dt
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _decoded(value, arg, name)
            except (TypeError, ValueError, KeyError):
                continue
        raise TypeError(f"{name}={value!r} is none of {tp}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise TypeError(f"{name}={value!r} is not one of {args}")
    if origin is not None and isinstance(origin, type) and issubclass(
            origin, collections.abc.Sequence) and not issubclass(origin, str):
        if not isinstance(value, list):
            raise TypeError(f"{name}={value!r} is not a sequence")
        if len(args) == 2 and args[1] is Ellipsis:
            items = [_decoded(v, args[0], name) for v in value]
        elif args and len(args) == len(value):
            items = [_decoded(v, a, name) for v, a in zip(value, args)]
        else:
            items = [_decoded(v, args[0] if args else None, name) for v in value]
        return list(items) if origin is list else tuple(items)
    if tp is torch.dtype:
        dt = getattr(torch, str(value), None)
        if not isinstance(dt, torch.dtype):
            raise TypeError(f"{name}={value!r} is not a torch dtype")
        return dt
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, str) and value in tp.__members__:
            return tp[value]
        return tp(value)  # ValueError where the installed enum has no such member
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeError(f"{name}={value!r} is not a bool")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError(f"{name}={value!r} is not an int")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError(f"{name}={value!r} is not a number")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise TypeError(f"{name}={value!r} is not a {tp.__name__}")
    return value  # a typing construct this does not know: the value as recorded


def rebuild_spec(i: int, g: dict, e: dict) -> Any:
    """Group `i`'s spec, of the class the manifest names, from its recorded fields: the
    fields the installed class lacks are left out, the required ones an older manifest lacks
    take SPEC_DEFAULTS (or the engine's block size)."""
    cls = spec_class(i, g)
    kinds = _annotations(cls)
    kw: dict[str, Any] = {}
    try:
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            required = (f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING)
            if g.get(f.name) is not None:
                value = g[f.name]
            elif not required:
                continue
            elif f.name == "block_size" and e.get("block_size"):
                value = int(e["block_size"])
            elif f.name in SPEC_DEFAULTS:
                value = SPEC_DEFAULTS[f.name]
            else:
                raise TraceError(f"KV cache group {i} of the trace ({g.get('spec')}) cannot be "
                                 f"rebuilt: the manifest does not record its {f.name}")
            kw[f.name] = _decoded(value, kinds.get(f.name), f.name)
        return cls(**kw)
    except TraceError:
        raise
    except Exception as ex:  # a recorded value the installed class refuses
        raise TraceError(f"KV cache group {i} of the trace ({g.get('spec')}) cannot be "
                         f"rebuilt: {type(ex).__name__}: {' '.join(str(ex).split())}"
                         ) from None


def mamba_cache_mode(e: dict) -> str | None:
    """The recorded Mamba cache mode (cache_config's, else a Mamba group's); None where the
    manifest records neither."""
    if e.get("mamba_cache_mode"):
        return str(e["mamba_cache_mode"])
    for g in e.get("kv_cache_groups") or []:
        if g.get("mamba_cache_mode"):
            return str(g["mamba_cache_mode"])
    return None


def _kv_config(e: dict, vc: Any) -> Any:
    """The recorded KV cache groups, each of its recorded spec class and fields (the head and
    state shapes too), or for an older manifest one full-attention group; no tensors (no
    worker)."""
    from vllm.v1 import kv_cache_interface as kvi

    recorded = e.get("kv_cache_groups") or [
        {"layers": 1, "spec": "FullAttentionSpec", "block_size": int(e["block_size"])}]
    groups = [kvi.KVCacheGroupSpec(
        [f"group{i}.layer{j}" for j in range(max(1, int(g.get("layers") or 1)))],
        rebuild_spec(i, g, e)) for i, g in enumerate(recorded)]
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
    if mode := mamba_cache_mode(e):
        # Scheduler.__init__ reads it (block-aligned chunks for Mamba "align"); vLLM's config
        # derives it from the model and prefix caching, the recording's engine may have set it
        vc.cache_config.mamba_cache_mode = mode
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
