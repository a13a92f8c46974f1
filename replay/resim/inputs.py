"""The scheduler's inputs as today's trace lets them be derived (vLLM-free).

A trace records what the scheduler emitted and the model outputs it was given, not the calls
that fed it. What a re-run needs is derived: the order of schedule(), update_from_output() and
finish_requests() from the recorder's clock (one monotonic clock, each call stamped when it
returned, so sorting by it is the order the calls were made in); each request's arrival as just
before the schedule() that first names it; aborts from `finish_events`; drafts from the spec
tokens a later step schedules; model outputs by each request's output position.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from dataclasses import dataclass, field

from vllm_contract.errors import TraceError
from vllm_contract.manifest import mid_stream_note
from vllm_contract.replay.worker import canonical
from vllm_contract.replay.worker.plan import most_in_flight, step_ranges

DERIVED = ("inputs derived from the recorded outputs (the trace has no input log yet): "
           "arrival at the first step that schedules a request; aborts from finish_events, "
           "one id per finish_requests() call in the recorded order; a request aborted before "
           "it was ever scheduled is made up (one prompt token); drafts from the spec tokens "
           "a request is next scheduled with; model outputs from model_outputs by each "
           "request's output position")


@dataclass(frozen=True)
class Call:
    kind: str  # "schedule", "update" or "abort"
    step: int
    req_id: str | None = None
    status: str | None = None  # abort: the RequestStatus name recorded


@dataclass
class Outputs:
    """The model's side of the recording: per request incarnation (req_id, n-th introduction),
    the token list recorded at each output position and the whole stream; per (step, req_id),
    the tokens that step gave it (for requests the scheduler no longer holds)."""
    rows: dict[tuple[str, int], dict[int, list[int]]] = field(default_factory=dict)
    streams: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    by_step: dict[tuple[int, str], list[int]] = field(default_factory=dict)

    def at(self, key: tuple[str, int], position: int) -> list[int] | None:
        row = self.rows.get(key, {}).get(position)
        if row is not None:
            return list(row)
        tail = self.streams.get(key, [])[position:position + 1]
        return tail or None


@dataclass
class Inputs:
    calls: list[Call]
    plains: dict[int, dict]  # step -> canonical SchedulerOutput of the recording
    outputs: Outputs
    finishes: dict[int, list[tuple[str, str]]]  # step -> its update's finishes, sorted
    spec: dict[str, tuple[list[int], list[list[int]]]]  # req_id -> (steps, spec tokens there)
    in_flight: int
    structured: bool  # a request uses structured output: the tokenizer is needed

    def next_drafts(self, req_id: str, step: int) -> list[int]:
        """The spec tokens the recording next schedules req_id with after `step`."""
        steps, tokens = self.spec.get(req_id, ([], []))
        i = bisect.bisect_right(steps, step)
        return list(tokens[i]) if i < len(steps) else []


def refuse_unusable(engine) -> None:
    """TraceError for a trace whose inputs cannot be derived at all."""
    m = engine.manifest
    note = mid_stream_note(m)
    if note:
        raise TraceError(f"resim needs the recording from the engine's start: {note}")
    dropped = [s for a, b in m.get("dropped_steps") or () for s in range(a, b + 1)]
    if dropped:
        raise TraceError(f"steps {step_ranges(dropped)} are absent from the trace (dropped "
                         "while recording): a re-run cannot skip the scheduler's work there")
    bad = sorted({r["step"] for r in engine.read("malformed_steps", ["step"]).to_pylist()})
    if bad:
        raise TraceError(f"steps {step_ranges(bad)} were quarantined as malformed: resim "
                         "cannot feed them")


def _calls(engine, steps: list[int]) -> list[Call]:
    timed = []
    for r in engine.read("steps", ["step", "t_ns"]).to_pylist():
        timed.append((r["t_ns"], 0, len(timed), Call("schedule", r["step"])))
    known = set(steps)
    for r in engine.read("updates", ["step", "t_ns"]).to_pylist():
        if r["step"] in known:
            timed.append((r["t_ns"], 1, len(timed), Call("update", r["step"])))
    for r in engine.read("finish_events").to_pylist():
        if r["source"] != "update_from_output":
            timed.append((r["t_ns"] or 0, 2, len(timed),
                          Call("abort", r["step"], r["req_id"], r["reason"])))
    return [c for *_, c in sorted(timed, key=lambda t: t[:3])]


def _outputs(engine, intro: dict[str, list[int]]) -> Outputs:
    out = Outputs()
    rows = engine.read("model_outputs", ["step", "req_id", "pos", "sampled_token_ids"])
    for r in sorted(rows.to_pylist(), key=lambda r: (r["step"], r["pos"])):
        rid, step, toks = r["req_id"], r["step"], list(r["sampled_token_ids"] or [])
        out.by_step[(step, rid)] = toks
        k = bisect.bisect_right(intro.get(rid, []), step) - 1
        if k < 0 or not toks:
            continue
        stream = out.streams.setdefault((rid, k), [])
        out.rows.setdefault((rid, k), {})[len(stream)] = toks
        stream.extend(toks)
    return out


def _structured(engine) -> bool:
    for r in engine.read("requests", ["sampling_params"]).to_pylist():
        sp = json.loads(r["sampling_params"]) if r["sampling_params"] else None
        if isinstance(sp, dict) and sp.get("structured_outputs") is not None:
            return True
    return False


def derive(engine) -> Inputs:
    refuse_unusable(engine)
    plains = dict(canonical.from_trace(engine))
    steps = sorted(plains)
    if not steps:
        raise TraceError(f"engine {engine.name} has no recorded steps to re-run")
    if steps != list(range(steps[0], steps[0] + len(steps))):
        gaps = sorted(set(range(steps[0], steps[-1] + 1)) - set(steps))
        raise TraceError(f"steps {step_ranges(gaps)} are absent from the trace: a re-run "
                         "cannot skip them")
    intro: dict[str, list[int]] = defaultdict(list)
    spec: dict[str, tuple[list[int], list[list[int]]]] = {}
    for s in steps:
        for r in plains[s]["scheduled_new_reqs"]:
            intro[r["req_id"]].append(s)
        drafts = plains[s]["scheduled_spec_decode_tokens"] or {}
        for rid in plains[s]["num_scheduled_tokens"]:
            at, toks = spec.setdefault(rid, ([], []))
            at.append(s)
            toks.append(list(drafts.get(rid) or []))
    finishes: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for r in engine.read("finish_events").to_pylist():
        if r["source"] == "update_from_output":
            finishes[r["step"]].append((r["req_id"], r["reason"]))
    return Inputs(_calls(engine, steps), plains, _outputs(engine, intro),
                  {s: sorted(v) for s, v in finishes.items()}, spec,
                  most_in_flight(engine), _structured(engine))
