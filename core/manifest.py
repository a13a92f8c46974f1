"""The manifest's schema, checked before anything reads a value from it.

A manifest is JSON the reader did not write: a value of the wrong type (`recorder_errors: 5`), a
number past int64 or a nesting thousands deep would otherwise surface as a TypeError, an
OverflowError or a RecursionError far from the file. Each known key is checked for its type and
range here, and a violation is a TraceError naming the file and the key. Unknown keys pass: a
newer recorder may add some (forward compatibility).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable

from vllm_contract import schema
from vllm_contract.errors import TraceError

MAX_DEPTH = 32  # the deepest manifest the recorder writes nests 4 levels
MAX_BYTES = 16 << 20  # the largest real ones hold a few hundred pruned segments
I64_MAX = (1 << 63) - 1

Check = Callable[[Any, str], None]


class _Bad(Exception):
    """A violation at a key path; turned into a TraceError naming the file."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _int(lo: int = -I64_MAX - 1, hi: int = I64_MAX) -> Check:
    def check(v: Any, where: str) -> None:
        if type(v) is not int:
            raise _Bad(where, f"must be an integer, not {_type_name(v)}")
        if not lo <= v <= hi:
            raise _Bad(where, f"{v} is out of range ({lo}..{hi})")
    return check


def _num(v: Any, where: str) -> None:
    if type(v) not in (int, float):
        raise _Bad(where, f"must be a number, not {_type_name(v)}")
    if not math.isfinite(v) or abs(v) > 1e18:
        raise _Bad(where, f"{v} is not a plausible time or size")


def _of(t: type, name: str) -> Check:
    def check(v: Any, where: str) -> None:
        if type(v) is not t:
            raise _Bad(where, f"must be {name}, not {_type_name(v)}")
    return check


_bool = _of(bool, "a boolean")
_str = _of(str, "a string")


def _opt(c: Check) -> Check:
    def check(v: Any, where: str) -> None:
        if v is not None:
            c(v, where)
    return check


def _list(item: Check | None = None) -> Check:
    def check(v: Any, where: str) -> None:
        if type(v) is not list:
            raise _Bad(where, f"must be a list, not {_type_name(v)}")
        if item is not None:
            for i, x in enumerate(v):
                item(x, f"{where}[{i}]")
    return check


def _obj(keys: dict[str, Check] | None = None, values: Check | None = None) -> Check:
    def check(v: Any, where: str) -> None:
        if type(v) is not dict:
            raise _Bad(where, f"must be an object, not {_type_name(v)}")
        for k, c in (keys or {}).items():
            if k in v:
                c(v[k], f"{where}.{k}")
        if values is not None:
            for k, x in v.items():
                values(x, f"{where}.{k}")
    return check


def _range(v: Any, where: str) -> None:
    """An inclusive [first, last] range of step numbers."""
    if type(v) is not list or len(v) != 2:
        raise _Bad(where, "must be a [first, last] pair of step numbers")
    for i, x in enumerate(v):
        _int(0)(x, f"{where}[{i}]")
    if v[0] > v[1]:
        raise _Bad(where, f"first step {v[0]} is after last step {v[1]}")


_count = _opt(_int(0))
_ENGINE = _obj({
    "model": _opt(_str), "dtype": _opt(_str), "max_model_len": _count, "seed": _opt(_int()),
    "block_size": _count, "enable_prefix_caching": _opt(_bool), "num_kv_blocks": _count,
    "max_num_batched_tokens": _count, "max_num_seqs": _count, "chunked_prefill": _opt(_bool),
    "async_scheduling": _opt(_bool), "speculative": _opt(_obj()), "parallel": _opt(_obj()),
    "scheduler_class": _opt(_str),
    # recorded since issue 30: absent from older manifests, null where vLLM lacks them
    "policy": _opt(_str), "long_prefill_token_threshold": _count,
    "long_prefill_token_threshold_adaptive": _opt(_bool), "max_num_partial_prefills": _count,
    "max_long_partial_prefills": _count, "max_num_scheduled_tokens": _count,
    "max_num_active_seqs": _count, "watermark": _opt(_num),
    "scheduler_reserve_full_isl": _opt(_bool), "disable_chunked_mm_input": _opt(_bool),
    "prefix_caching_hash_algo": _opt(_str), "scheduler_block_size": _count,
    "hash_block_size": _count, "prefix_cache_retention_interval": _count,
    "kv_connector": _opt(_str), "runner_type": _opt(_str), "mamba_cache_mode": _opt(_str),
    # each group's spec: the fields its block rules read are typed here; the rest of the
    # spec's plain fields (head or state shapes) are kept as recorded
    "kv_cache_groups": _opt(_list(_obj({"layers": _count, "spec": _opt(_str),
                                        "kind": _opt(_str),
                                        "block_size": _count, "sliding_window": _count,
                                        "attention_chunk_size": _count,
                                        "extra_retained_tokens": _count,
                                        "mamba_cache_mode": _opt(_str),
                                        "num_speculative_blocks": _count}))),
})

KEYS: dict[str, Check] = {
    "vllm_version": _opt(_str),
    "engine": _opt(_ENGINE),
    "host": _opt(_str), "pid": _opt(_int()), "dp_rank": _opt(_int()),
    "started_at": _opt(_num), "ended_at": _opt(_num),
    "closed_cleanly": _bool,
    "recorder_errors": _list(_obj({"time": _opt(_num), "error": _opt(_str)})),
    "steps_recorded": _int(0), "steps_malformed": _int(0),
    "stopped": _obj({"after_step": _opt(_int()), "error": _opt(_str)}),
    "dropped_steps": _list(_range),
    "dropped_steps_total": _int(0),
    "pruned_segments": _list(_obj({"segment": _opt(_int()), "bytes": _count,
                                   "steps": _opt(_range), "reason": _opt(_str)})),
    "pickled_opaque": _opt(_bool), "redacted_prompts": _opt(_bool),
    "worker_replayable": _opt(_bool), "attached_mid_stream": _opt(_bool),
    "redaction": _opt(_obj()), "writer": _opt(_obj()), "worker_state_at_start": _opt(_obj()),
    "limits": _opt(_obj()), "transport": _opt(_obj()),
    "started_by": _opt(_str), "ended_by": _opt(_str),
    "recording_started_at": _opt(_num),
    "fields": _opt(_obj(values=_list(_str))),
    "field_types": _opt(_obj(values=_obj(values=_opt(_str)))),
    "contract_drift": _opt(_obj({"unknown_fields": _opt(_obj(values=_list(_str))),
                                 "missing_fields": _opt(_obj(values=_list(_str)))})),
    "compaction_warnings": _list(_str),
}

# Strings first (a bracket inside one does not nest), then every bracket in order.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


def depth(text: str) -> int:
    """How deep the JSON text's arrays and objects nest (0 for a scalar)."""
    deepest = level = 0
    for m in _BRACKETS.finditer(_STRING.sub("", text)):
        level += 1 if m.group() in "[{" else -1
        deepest = max(deepest, level)
    return deepest


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse(path: Path, data: bytes) -> dict:
    """The manifest in `data` (the bytes of `path`), checked; a TraceError if it is unusable."""
    if len(data) > MAX_BYTES:
        raise TraceError(f"{path}: manifest is {len(data)} bytes, larger than any recorder "
                         f"writes ({MAX_BYTES}): not a vllm-contract manifest")
    try:
        text = data.decode("utf-8")
        if depth(text) > MAX_DEPTH:
            raise TraceError(f"{path}: manifest nests deeper than {MAX_DEPTH} levels: "
                             "not a vllm-contract manifest")
        manifest = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError too
        raise TraceError(f"{path}: manifest is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or "format_version" not in manifest:
        raise TraceError(f"{path}: manifest has no format_version: not a vllm-contract trace")
    version = manifest["format_version"]
    if type(version) is not int or version > schema.FORMAT_VERSION:
        shown = json.dumps(version)[:40]
        raise TraceError(f"{path}: trace format version {shown} is newer than this "
                         f"vllm-contract reads ({schema.FORMAT_VERSION}); upgrade vllm-contract")
    if version < 1:
        raise TraceError(f"{path}: manifest key format_version: {version} is not a format "
                         "version (they start at 1)")
    validate(manifest, path)
    return manifest


def validate(manifest: dict, path: Path | str = "manifest") -> None:
    """Check each known key's type and range; unknown keys pass."""
    try:
        for key, check in KEYS.items():
            if key in manifest:
                check(manifest[key], key)
    except _Bad as e:
        raise TraceError(f"{path}: manifest key {e}") from None


def mid_stream_note(m: dict) -> str | None:
    """The one line every command gives a trace begun on a running engine (None otherwise)."""
    if not m.get("attached_mid_stream"):
        return None
    state = m.get("worker_state_at_start") or {}
    held, owed = state.get("requests"), state.get("finished_ids")
    what = ("" if held is None or owed is None else
            f" whose worker already held {held} request(s) and was owed {owed} finished id(s)")
    return (f"the recording began mid-stream, attached to a running engine{what}: what they "
            "did before the first recorded step is not in the trace, and no check or worker "
            "finding blames the scheduler for it")
