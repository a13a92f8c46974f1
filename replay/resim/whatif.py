"""What-if runs (docs/resim.md, "What-if runs"): the re-run with other settings or another
scheduler class runs on its own schedule until every request has finished, and is compared
with the recording in aggregate (steps to drain, preemptions, tokens per step, waiting, time
to first token, peak KV blocks held) instead of step by step. The measures are one function
(`measure`) of the canonical SchedulerOutputs, fed the recording's rows on one side and the
re-run's live outputs on the other, so both sides are counted the same way. The run itself,
which steps the re-run, is whatif_run.py's."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Facts:
    """One step as the measures read it: the canonical SchedulerOutput, the requests its
    update gave a token, and the requests that ended after it (its update's finishes, and
    the aborts fed before the next step)."""
    step: int
    plain: dict
    sampled: set[str] = field(default_factory=set)
    ended: list[str] = field(default_factory=list)


def percentile(values: list[int], q: float) -> int | None:
    """Nearest rank: the smallest value with at least q % of the values at or below it."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s) / 100) - 1)]


def _blocks(ids: Any) -> list[tuple[int, int]]:
    # block 0 is vLLM's null block (a sliding window's dropped blocks point at it): not held
    return [(g, b) for g, group in enumerate(ids or []) for b in (group or []) if b]


class _Held:
    """Distinct KV blocks referenced by the block tables sent to the worker, per request."""

    def __init__(self) -> None:
        self.tables: dict[str, list[tuple[int, int]]] = {}
        self.refs: dict[tuple[int, int], int] = defaultdict(int)

    def drop(self, rid: str) -> None:
        for b in self.tables.pop(rid, []):
            self.refs[b] -= 1
            if not self.refs[b]:
                del self.refs[b]

    def add(self, rid: str, blocks: list[tuple[int, int]]) -> None:
        self.tables.setdefault(rid, []).extend(blocks)
        for b in blocks:
            self.refs[b] += 1

    def step(self, plain: dict) -> int:
        for rid in (plain.get("finished_req_ids") or []) + (plain.get("preempted_req_ids") or []):
            self.drop(rid)
        for r in plain["scheduled_new_reqs"]:
            self.drop(r["req_id"])
            self.add(r["req_id"], _blocks(r.get("block_ids")))
        c = plain["scheduled_cached_reqs"]
        resumed = set(c.get("resumed_req_ids") or [])
        for rid, ids in zip(c["req_ids"], c["new_block_ids"]):
            if rid in resumed:  # a resumed request's table is sent whole
                self.drop(rid)
            self.add(rid, _blocks(ids))
        return len(self.refs)


def measure(facts: list[Facts], arrivals: list[tuple[int, str]]) -> dict:
    """The comparison's numbers for one side. `arrivals`: (step, req_id) of each request
    incarnation, at the step it was added."""
    arriving: dict[int, list[str]] = defaultdict(list)
    for s, rid in arrivals:
        arriving[s].append(rid)
    live: dict[str, dict] = {}
    done: list[dict] = []
    held, peak, preemptions, tokens = _Held(), 0, 0, []
    for f in facts:
        for rid in arriving.pop(f.step, []):
            if rid in live:  # a reused id whose earlier request's end the side never said
                done.append(live.pop(rid))
            live[rid] = {"arrival": f.step, "waited": 0, "first": None}
        nst = f.plain["num_scheduled_tokens"]
        tokens.append(sum(nst.values()))
        preemptions += len(f.plain.get("preempted_req_ids") or [])
        for rid, r in live.items():
            if rid not in nst:
                r["waited"] += 1
            elif r["first"] is None and rid in f.sampled:
                r["first"] = f.step
        peak = max(peak, held.step(f.plain))
        for rid in f.ended:
            if rid in live:
                done.append(live.pop(rid))
    done.extend(live.values())
    waits = [r["waited"] for r in done]
    ttft = [r["first"] - r["arrival"] + 1 for r in done if r["first"] is not None]
    busy = [f.step for f in facts if f.plain["num_scheduled_tokens"]]
    # to the last step that scheduled a token: a recording's last step often only delivers
    # finished ids, which a re-run that stops once nothing is left does not make
    return {"steps_to_drain": busy[-1] - facts[0].step + 1 if busy else 0,
            "requests": len(done), "preemptions": preemptions,
            "tokens_per_step_p50": percentile(tokens, 50),
            "tokens_per_step_p95": percentile(tokens, 95),
            "waiting_steps_p50": percentile(waits, 50), "waiting_steps_p99": percentile(waits, 99),
            "ttft_steps_p50": percentile(ttft, 50), "ttft_steps_p99": percentile(ttft, 99),
            "peak_kv_blocks": peak}


def abort_steps(inputs) -> dict[int, list]:
    """Each recorded abort, keyed by the step whose schedule() the recording made next (one
    past the last step for the aborts after it)."""
    out: dict[int, list] = defaultdict(list)
    later = []
    for call in inputs.calls:
        if call.kind == "abort":
            later.append(call)
        elif call.kind == "schedule":
            if later:
                out[call.step].extend(later)
            later = []
    if later:
        out[max(inputs.plains) + 1].extend(later)
    return out


def recorded_side(inputs) -> dict:
    """The recording's measures, from its canonical SchedulerOutputs and model outputs."""
    given: dict[int, set[str]] = defaultdict(set)
    for (step, rid), toks in inputs.outputs.by_step.items():
        if toks:
            given[step].add(rid)
    aborted = abort_steps(inputs)
    facts, arrivals = [], []
    if inputs.added is not None:  # where each request was added: it waited from there
        first = min(inputs.plains)
        t = inputs.added.table
        arrivals = [(max(first, s + 1), rid) for s, rid in zip(t["step"].to_pylist(),
                                                               t["req_id"].to_pylist())]
    for s in sorted(inputs.plains):
        plain = inputs.plains[s]
        if inputs.added is None:  # derived: a request arrives where it is first scheduled
            arrivals += [(s, r["req_id"]) for r in plain["scheduled_new_reqs"]]
        ended = [rid for rid, _ in inputs.finishes.get(s, [])]
        ended += [c.req_id for c in aborted.get(s + 1, [])]
        facts.append(Facts(s, plain, given[s], ended))
    return measure(facts, arrivals)


@dataclass
class Comparison:
    recording: dict
    rerun: dict
    notes: list[str] = field(default_factory=list)  # how the what-if run ended, if not drained

    def as_dict(self) -> dict:
        return {"recording": dict(self.recording), "rerun": dict(self.rerun),
                "notes": list(self.notes)}


_ROWS = [("steps to drain", ("steps_to_drain",)), ("requests", ("requests",)),
         ("preemptions", ("preemptions",)),
         ("tokens per step p50 / p95", ("tokens_per_step_p50", "tokens_per_step_p95")),
         ("waiting, steps p50 / p99", ("waiting_steps_p50", "waiting_steps_p99")),
         ("first token, steps p50 / p99", ("ttft_steps_p50", "ttft_steps_p99")),
         ("peak KV blocks held", ("peak_kv_blocks",)),
         ("catalog errors / warnings", ("errors", "warnings"))]


def table(c: Comparison) -> list[str]:
    def cell(side: dict, keys: tuple) -> str:
        if any(k not in side for k in keys):
            return "-"
        return " / ".join("-" if side[k] is None else f"{side[k]:,}" for k in keys)

    lines = [f"{'':30}{'recording':>14}{'re-run':>14}"]
    for label, keys in _ROWS:
        lines.append(f"{label:30}{cell(c.recording, keys):>14}{cell(c.rerun, keys):>14}")
    return lines + c.notes
