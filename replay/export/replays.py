"""A replay's result (stepping.ReplayRun) in every format of `replay --format`, whichever the
worker: a worker that compares tokens adds what the comparison found."""

from __future__ import annotations

from vllm_contract.replay.export.registry import Rendered, exporter
from vllm_contract.replay.export.text import json_doc, json_lines

KIND = "replay"


def _line(f) -> str:
    who = f" req {f.req_id}" if f.req_id else ""
    return f"{f.severity.upper():7} {f.invariant}  step {f.step}{who}: {f.details}\n"


@exporter(KIND, "table")
def table(run) -> Rendered:
    r = Rendered()
    for n in run.notes:
        r.err(f"note: {n}\n")
    if run.not_comparable:
        first = next(iter(run.not_comparable.items()))
        r.err(f"note: {len(run.not_comparable)} request(s) not compared token for token "
              f"(e.g. {first[0]}: {first[1]}); --force-recorded-tokens keeps their recorded "
              "context\n")
    for f in run.all_findings():
        r.out(_line(f))
    if run.crash and run.crash.get("traceback"):
        r.err(run.crash["traceback"].rstrip() + "\n")
    if not run.compares_tokens:
        return r.out(f"{run.steps_replayed} step(s) replayed into {run.title}: "
                     f"{len(run.findings)} finding(s)\n")
    return r.out(f"{run.steps_replayed} of {run.planned} step(s) replayed into {run.title} "
                 f"(engine {run.engine}): {len(run.divergences)} divergence(s), "
                 f"{len(run.findings)} other finding(s)\n")


@exporter(KIND, "json")
def as_json(run) -> Rendered:
    return Rendered().out(json_doc(run.to_dict()))


@exporter(KIND, "jsonl")
def as_jsonl(run) -> Rendered:
    return Rendered().out(json_lines([f.to_dict() for f in run.all_findings()]))
