"""resim(): a recording and a ResimOptions made into a run ready to step (the strict re-run,
run.Resim, or the what-if run, whatif_run.WhatIf), with every check on the input made before
the first step and the notes that say how the re-run differs from the recording."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vllm_contract.errors import TraceError
from vllm_contract.replay.resim import build as building
from vllm_contract.replay.resim import debug, log, record
from vllm_contract.replay.resim.core import ResimRun, Setup
from vllm_contract.replay.resim.inputs import DERIVED, derive
from vllm_contract.replay.resim.options import ResimOptions
from vllm_contract.replay.resim.run import Resim
from vllm_contract.replay.resim.whatif_run import WhatIf


def _open(trace_path: str | Path, engine: str | None):
    from vllm_contract.replay.worker.plan import pick_engine
    from vllm_contract.trace import open_trace

    return pick_engine(open_trace(trace_path), engine)


def cannot_reproduce(engine: dict) -> list[str]:
    """What the recording's engine did that a re-run with no worker cannot: said in one note,
    the run goes on (the scheduler's decisions up to where they depend on it still count)."""
    out = []
    if engine.get("kv_connector"):
        out.append(f"the KV connector's transfers ({engine['kv_connector']}): the re-run's "
                   "outputs report no finished sends or receives, so requests waiting on a "
                   "remote KV load are scheduled as if it never came")
    if engine.get("runner_type") == "pooling":
        out.append("pooling outputs: the re-run's outputs carry no pooler output, so pooling "
                   "requests do not finish as they did")
    return out


def resim(trace_path: str | Path, options: ResimOptions | None = None,
          **fields: Any) -> ResimRun:
    """Re-run the installed vLLM Scheduler on a recorded trace, as `options` says (a
    ResimOptions; `fields`: its fields by name, over `options` or the defaults). A run.Resim,
    or with `whatif` a whatif_run.WhatIf. Raises TraceError for unusable input."""
    from vllm_contract.replay.worker.rebuild import rebuild

    if options is not None and not isinstance(options, ResimOptions):
        raise TypeError(f"resim(trace, options): options is a ResimOptions, not "
                        f"{type(options).__name__} (give the engine as engine=)")
    opts = dataclasses.replace(options or ResimOptions(), **fields)
    whatif, arrivals = opts.whatif, opts.arrivals
    if arrivals not in ("step", "time"):
        raise TraceError(f"--arrivals {arrivals}: use step or time")
    if arrivals == "time" and not whatif:
        raise TraceError("--arrivals time is for a what-if run (--set or --scheduler-cls): "
                         "a re-run of the recording adds each request where it was added")
    overrides = building.named(opts.overrides) or None
    eng = _open(trace_path, opts.engine)
    inputs = derive(eng)
    if (opts.keep is not None or opts.trim) and not (whatif and inputs.logged):
        raise TraceError("a run of some of the requests, or of shorter ones, is a what-if run "
                         "of a trace with an input log (format 3)")
    if arrivals == "time" and not inputs.logged:
        raise TraceError("--arrivals time needs the recorded arrival times: the trace has no "
                         "input log (format 2 or before)")
    break_at, until = opts.break_at, opts.until
    debug.check_step("--break-at", break_at, inputs.plains)
    debug.check_step("--until", until, inputs.plains)
    if break_at is not None and until is not None and break_at > until:
        raise TraceError(f"--break-at {break_at} is after --until {until}: the run stops first")
    if opts.break_hook is not None and break_at is None:
        raise TraceError("--break-hook needs --break-at STEP: it is called at that step")
    hook = debug.hook_of(opts.break_hook) if break_at is not None else None
    if opts.out is not None:
        record.refuse_used(opts.out)
    settings = building.settings_of(eng, overrides)
    if (eng.manifest.get("redacted_prompts") and settings.get("enable_prefix_caching")
            and not inputs.logged):
        raise TraceError("the trace was recorded with redacted prompts and prefix caching on: "
                         "cache hits depend on the prompt tokens, which the trace lacks")
    cls, name = building.scheduler_class(opts.scheduler_cls, eng, inputs.in_flight)
    notes = [log.NOTE if inputs.logged else DERIVED]
    recorded = (eng.manifest.get("engine") or {}).get("scheduler_class")
    if recorded and recorded != name.replace(":", "."):
        notes.append(f"recorded with {recorded}; re-run with {name}")
    if overrides:
        notes.append("settings overridden: " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
        if lacking := building.not_applied(overrides):
            notes.append(f"not applied, the installed vLLM has no such setting: "
                         f"{', '.join(lacking)}")
    rebuilt = rebuild(eng)
    if rebuilt.drift:
        notes.append(f"recorded by vLLM {eng.manifest.get('vllm_version')}, re-run on "
                     f"{rebuilt.installed_version}, whose classes differ: "
                     + "; ".join(rebuilt.drift))
    built = building.build(settings, cls, name, inputs.structured)
    if not overrides or not {"num_kv_blocks", "block_size"} & set(overrides):
        notes += building.start_from(built.scheduler, eng.manifest.get("kv_cache_at_start"))
    if beyond := cannot_reproduce(eng.manifest.get("engine") or {}):
        notes.append("not reproduced: " + "; ".join(beyond))
    # a manifest older than these settings: the re-run takes vLLM's defaults for them
    unrecorded = built.unrecorded + ([] if inputs.logged else ["cache salts"])
    if unrecorded:
        notes.append("not recorded, so vLLM's defaults: " + ", ".join(unrecorded))
    source = {"trace": str(trace_path), "engine": eng.name, "scheduler_class": name,
              "overrides": {k: v if v is None or isinstance(v, (bool, int, float, str))
                            else str(v) for k, v in (overrides or {}).items()}}
    if whatif:
        where = ("arrivals by recorded arrival time on a clock advanced by the recorded step "
                 "durations" if arrivals == "time" else "arrivals at the recording's step index")
        notes.append(f"what-if run: {where}, aborts before the "
                     "step the recording fed them before, one batch in flight, no drafts; a "
                     "request is finished when it has used all its recorded outputs")
    setup = Setup(eng, inputs, built, rebuilt, notes, source, hook)
    return (WhatIf if whatif else Resim)(setup, opts)
