"""A replay's result in every format of `replay --format`: the shadow worker's (a
stepping.ReplayRun) and a real vLLM worker's (a real_run.RealResult). Both have the same
formats, which `replay --format` offers for either worker."""

from __future__ import annotations

from vllm_contract.replay.export.registry import Rendered, exporter
from vllm_contract.replay.export.text import json_doc, json_lines

SHADOW = "replay"
REAL = "real-replay"


def _line(f, message: str) -> str:
    who = f" req {f.req_id}" if f.req_id else ""
    return f"{f.severity.upper():7} {f.invariant}  step {f.step}{who}: {message}\n"


@exporter(SHADOW, "table")
def shadow_table(run) -> Rendered:
    r = Rendered()
    for n in run.notes:
        r.err(f"note: {n}\n")
    for f in run.findings:
        r.out(_line(f, f.message.split(": ", 1)[-1]))
    return r.out(f"{run.steps_replayed} step(s) replayed into the {run.worker} worker: "
                 f"{len(run.findings)} finding(s)\n")


@exporter(SHADOW, "json")
def shadow_json(run) -> Rendered:
    return Rendered().out(json_doc(run.to_dict()))


@exporter(SHADOW, "jsonl")
def shadow_jsonl(run) -> Rendered:
    return Rendered().out(json_lines([f.to_dict() for f in run.findings]))


@exporter(REAL, "table")
def real_table(res, planned: int) -> Rendered:
    """`planned`: the steps the replay meant to run, of which res.steps_replayed ran."""
    r = Rendered()
    for n in res.notes:
        r.err(f"note: {n}\n")
    if res.not_comparable:
        first = next(iter(res.not_comparable.items()))
        r.err(f"note: {len(res.not_comparable)} request(s) not compared token for token "
              f"(e.g. {first[0]}: {first[1]}); --force-recorded-tokens keeps their recorded "
              "context\n")
    for f in res.all_findings():
        r.out(_line(f, f.details))
    if res.crash and res.crash.get("traceback"):
        r.err(res.crash["traceback"].rstrip() + "\n")
    return r.out(f"{res.steps_replayed} of {planned} step(s) replayed into a vLLM worker "
                 f"(engine {res.engine}): {len(res.divergences)} divergence(s), "
                 f"{len(res.findings)} other finding(s)\n")


@exporter(REAL, "json")
def real_json(res, planned: int) -> Rendered:
    return Rendered().out(json_doc(res.to_dict()))


@exporter(REAL, "jsonl")
def real_jsonl(res, planned: int) -> Rendered:
    return Rendered().out(json_lines([f.to_dict() for f in res.all_findings()]))
