"""What a replay into a real vLLM worker needs, checked before any engine starts (vLLM-free).

A real worker keeps per-request state across steps, so it cannot skip a step nor begin where
it would be told about requests it never saw introduced. `plan()` reads the manifest and the
trace's request lifecycle and raises a one-line TraceError for every input a replay cannot use:
a model that is not there, redacted prompts, several engines without a choice, a start inside
a request's life (a trace begun mid-stream by attaching), steps absent from the trace, and
speculative decoding (the worker's drafter is not replayed). What it can use but not compare
token for token (unseeded sampling, structured output without its grammar bitmask) is listed
in `not_comparable`.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.manifest import mid_stream_note


@dataclass
class Plan:
    engine: object  # the EngineTrace
    model: str
    kv_blocks: int  # enough for the largest recorded block id
    options: dict  # vllm.LLM keyword arguments, from the manifest
    steps: list[int]  # the steps to replay, in order
    not_comparable: dict[str, str] = field(default_factory=dict)  # req_id -> why
    notes: list[str] = field(default_factory=list)


def pick_engine(trace, engine: str | None):
    """The engine to replay: named, or the only one."""
    engines = {e.name: e for e in trace.engines}
    if engine is None:
        if len(engines) > 1:
            raise TraceError(f"the trace has {len(engines)} engines ({', '.join(engines)}): "
                             "choose one with --engine")
        return next(iter(engines.values()))
    engine = schema.plain_engine(engine)
    if engine not in engines:
        raise TraceError(f"no engine {engine!r} in the trace (it has {', '.join(engines)})")
    return engines[engine]


def step_ranges(steps: list[int]) -> str:
    """Steps as runs, e.g. "3-5, 9"."""
    out, run = [], []
    for s in sorted(set(steps)):
        if run and s == run[-1] + 1:
            run.append(s)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [s]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def _max_block(engine) -> int:
    """The largest block id any step hands the worker (-1 when none)."""
    col = engine.read("scheduled", ["new_block_ids"]).column("new_block_ids")
    flat = pc.list_flatten(pc.list_flatten(col))
    top = pc.max(flat).as_py() if len(flat) else None
    return -1 if top is None else int(top)


def _blocked_starts(engine) -> list[tuple[int, int]]:
    """Intervals (lo, hi] of start steps at which the worker would be told about a request it
    never saw introduced: a cached row at step t of a request last introduced at step i < t
    forbids every start in (i, t]. A request never introduced before t forbids every start up
    to t in a trace begun mid-stream (the worker held it before the first step); in a trace
    recorded from the engine's start it is a broken contract, for the crash check to stop at."""
    m = engine.manifest
    held = (m.get("worker_state_at_start") or {}).get("requests")
    # begun mid-stream with requests already held; owing the worker only finished ids is not
    mid_stream = bool(m.get("attached_mid_stream")) and held != 0
    rows = engine.read("scheduled", ["step", "req_id", "kind"]).to_pylist()
    last_new: dict[str, int] = {}
    out = []
    for r in sorted(rows, key=lambda r: (r["step"], r["kind"] != "new")):
        if r["kind"] == "new":
            last_new[r["req_id"]] = r["step"]
        elif r["kind"] is not None:
            if r["req_id"] in last_new:
                out.append((last_new[r["req_id"]], r["step"]))
            elif mid_stream:
                out.append((-(2**62), r["step"]))
    return out


def valid_starts(engine, steps: list[int]) -> list[int]:
    """Steps from which a fresh worker can replay without meeting a request it never saw."""
    bad = set()
    blocked = sorted(_blocked_starts(engine))
    i = 0
    merged: list[list[int]] = []
    for lo, hi in blocked:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    for s in steps:
        while i < len(merged) and merged[i][1] < s:
            i += 1
        if i < len(merged) and merged[i][0] < s <= merged[i][1]:
            bad.add(s)
    return [s for s in steps if s not in bad]


def _comparable(engine) -> dict[str, str]:
    out = {}
    for r in engine.read("requests", ["req_id", "sampling_params"]).to_pylist():
        sp = json.loads(r["sampling_params"]) if r["sampling_params"] else None
        if not isinstance(sp, dict):
            continue
        if sp.get("structured_outputs") is not None:
            out[r["req_id"]] = ("structured output: the trace has no grammar bitmask, so the "
                                "replay samples it unconstrained")
        elif (sp.get("temperature") or 0) > 0 and sp.get("seed") is None:
            out[r["req_id"]] = "sampled without a seed (temperature > 0)"
    return out


def most_in_flight(engine) -> int:
    """The most batches in flight at any update_from_output(): schedule() calls returned from
    its own step on, by the recorded clocks (1: one batch at a time)."""
    steps = engine.read("steps", ["step", "t_ns"]).to_pylist()
    order = {r["step"]: i for i, r in enumerate(sorted(steps, key=lambda r: r["step"]))}
    times = sorted(r["t_ns"] for r in steps if r["t_ns"] is not None)
    most = 1
    for u in engine.read("updates", ["step", "t_ns"]).to_pylist():
        if u["t_ns"] is None or u["step"] not in order:
            continue
        most = max(most, bisect.bisect_right(times, u["t_ns"]) - order[u["step"]])
    return most


# What vLLM reads from a local model directory before anything else. Checked here because vLLM
# finds out only while it builds the engine, with an error that does not say what is missing.
_CONFIGS = ("config.json", "params.json")  # Hugging Face's, Mistral's
_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.safetensors.index.json", "*.bin.index.json")


def _model_dir_lacks(path: Path) -> str | None:
    """What a local model directory lacks (its config, its weights), or None. A file (a GGUF
    model is one) is left to vLLM."""
    if not path.is_dir():
        return None
    if not any((path / name).is_file() for name in _CONFIGS):
        return "config.json"
    if not any(next(path.glob(pattern), None) for pattern in _WEIGHTS):
        return "weights (" + ", ".join(_WEIGHTS[:3]) + " files, or an index of them)"
    return None


def model_path(engine, model: str | None = None) -> str:
    """The model a real worker loads: `model` (--model), else the one the manifest names;
    TraceError unless it is there and looks like a model."""
    path = model or (engine.manifest.get("engine") or {}).get("model")
    if not path:
        raise TraceError("the trace's manifest names no model: give one with --model PATH")
    where = "given with --model" if model else "named by the trace's manifest"
    if not Path(path).exists():
        raise TraceError(f"model {path} ({where}) does not exist here: point at a copy of it "
                         "with --model PATH")
    if lacks := _model_dir_lacks(Path(path)):
        raise TraceError(f"model {path} ({where}) is not a model directory: it has no "
                         f"{lacks}; point at a copy of the model with --model PATH")
    return path


def _dtype(text: str | None) -> str:
    return (text or "auto").removeprefix("torch.")


def plan(engine, model: str | None = None, start: int | None = None,
         until: int | None = None) -> Plan:
    m = engine.manifest
    e = m.get("engine") or {}
    if m.get("redacted_prompts"):
        raise TraceError("the trace was recorded with redacted prompts: a real worker needs "
                         "the prompt tokens to replay it (use --worker shadow)")
    if e.get("speculative"):
        raise TraceError("the trace was recorded with speculative decoding: replaying the "
                         "worker's drafter is not supported (use --worker shadow)")
    path = model_path(engine, model)
    steps = [int(s) for s in engine.read("steps", ["step"]).column("step").to_pylist()]
    steps.sort()
    if not steps:
        raise TraceError(f"engine {engine.name} has no recorded steps to replay")
    lo = steps[0] if start is None else start
    hi = steps[-1] if until is None else until
    chosen = [s for s in steps if lo <= s <= hi]
    if not chosen:
        raise TraceError(f"no recorded step in {lo}..{hi} (the trace has {steps[0]}..{steps[-1]})")
    starts = valid_starts(engine, steps)
    if chosen[0] not in starts:
        later = [s for s in starts if s > chosen[0]]
        why = ("the trace begins mid-stream (recorded by attaching to a running engine)"
               if m.get("attached_mid_stream") and chosen[0] == steps[0]
               else f"step {chosen[0]} schedules requests introduced before it")
        hint = (f"a replay could start from step {later[0]} (--from {later[0]})" if later
                else "no step of this trace can start a replay: replay it with --worker "
                     "shadow (which takes requests held before the first step as given), or "
                     "record from the engine's start or while it is idle")
        raise TraceError(f"a fresh worker cannot start at step {chosen[0]}: {why}, so it would "
                         f"meet requests it never saw; {hint}")
    gaps = [s for s in range(chosen[0], chosen[-1] + 1) if s not in set(chosen)]
    if gaps:
        after = [s for s in starts if s > gaps[-1]]
        hint = (f"replay --until {gaps[0] - 1}" + (f" or --from {after[0]}" if after else ""))
        raise TraceError(f"steps {step_ranges(gaps)} are absent from the trace and a real worker "
                         f"cannot skip steps: {hint}")
    blocks = max(int(e.get("num_kv_blocks") or 0), _max_block(engine) + 1, 1)
    par = e.get("parallel") or {}
    options = dict(model=path, skip_tokenizer_init=True, enforce_eager=True,
                   dtype=_dtype(e.get("dtype")), seed=int(e.get("seed") or 0),
                   num_gpu_blocks_override=blocks,
                   # the driver runs one batch at a time and teacher forcing writes where a
                   # synchronous worker keeps its tokens
                   async_scheduling=False)
    for ours, theirs in (("max_model_len", "max_model_len"), ("block_size", "block_size"),
                         ("max_num_seqs", "max_num_seqs"),
                         ("max_num_batched_tokens", "max_num_batched_tokens"),
                         ("enable_prefix_caching", "enable_prefix_caching"),
                         ("enable_chunked_prefill", "chunked_prefill")):
        if e.get(theirs) is not None:
            options[ours] = e[theirs]
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        if (par.get(key) or 1) > 1:
            options[key] = par[key]
    notes = [n for n in [mid_stream_note(m)] if n]
    comparable = _comparable(engine)
    flight = most_in_flight(engine)
    if flight > 1:
        notes.append(f"recorded with up to {flight} batches in flight (async scheduling or a "
                     "batch queue); the replay does not keep that overlap: its driver hands "
                     "the worker one batch at a time, in recorded order, and waits for its "
                     "tokens (async scheduling off), as vLLM's sync path does. The worker "
                     "sees the same SchedulerOutputs in the same order, so tokens are "
                     "compared as usual; timing between batches is not reproduced")
    return Plan(engine, path, blocks, options, chosen, comparable, notes)
