"""`export` and `report`: a trace as a timeline another tool opens (docs/timeline.md), and as
one HTML page (docs/report.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import Progress, err, fail
from vllm_contract.errors import TraceError

app = typer.Typer()

# the options both commands take: which steps, which engine
First = Annotated[Optional[int], typer.Option("--from", help="The first step drawn.")]
Last = Annotated[Optional[int], typer.Option("--until", help="The last step drawn.")]
Engine = Annotated[Optional[str], typer.Option("--engine", help="Only this engine (default "
                                               "all: a process, or a section, each).")]
Json = Annotated[bool, typer.Option("--json", help="What was written, as JSON.")]


@app.command()
def export(
    trace: Annotated[Path, typer.Argument(help="Trace directory (a root: every engine).")],
    perfetto: Annotated[Path, typer.Option("--perfetto", metavar="OUT.pftrace", help="Write a "
                                           "Perfetto timeline (TrackEvent protobuf) there: "
                                           "open it in ui.perfetto.dev.")],
    first: First = None,
    last: Last = None,
    engine: Engine = None,
    json_out: Json = False,
) -> None:
    """A timeline of the trace: per engine a process with a track of steps (with their counts
    as arguments), counters (tokens per step, running, waiting, KV usage, schedule() time),
    request lanes (waiting, prefill, decode, preempted, flows from a preemption to its resume)
    and every finding of the catalog as an instant event on its step and request."""
    from vllm_contract.replay.timeline.perfetto import export as run_export

    if perfetto.exists() and perfetto.is_dir():
        fail(f"--perfetto {perfetto} is a directory: give a file name")
    bar = Progress()
    try:
        counts = run_export(trace, perfetto, engine=engine, first=first, last=last,
                            progress=lambda done, total: bar.show(
                                f"exporting: {done:,} of {total:,} steps"))
    except TraceError as e:
        bar.end()
        fail(e)
    bar.end()
    if json_out:
        typer.echo(json.dumps({"perfetto": str(perfetto), **counts}, indent=2))
        return
    err(f"wrote {perfetto}: {counts['engines']} engine(s), {counts['steps']:,} steps, "
        f"{counts['requests']:,} requests in {counts['lanes']:,} lanes, "
        f"{counts['findings']:,} findings, {counts['bytes']:,} bytes")


@app.command()
def report(
    trace: Annotated[Path, typer.Argument(help="Trace directory (a root: every engine).")],
    out: Annotated[Path, typer.Option("--out", metavar="REPORT.html", help="The page to write: "
                                      "one file, everything inline (opens offline).")],
    first: First = None,
    last: Last = None,
    engine: Engine = None,
    json_out: Json = False,
) -> None:
    """A self-contained HTML page to attach to a bug report: `info`'s summary, the findings
    with their why and the vLLM code they rely on, and charts of tokens per step, batch size,
    KV usage, queue lengths, schedule() time, the requests' lanes and their time to first
    token and duration in steps."""
    from vllm_contract.replay.timeline.report import write

    if out.exists() and out.is_dir():
        fail(f"--out {out} is a directory: give a file name")
    bar = Progress(every=2.0)
    try:
        counts = write(trace, out, engine=engine, first=first, last=last, progress=bar.show)
    except TraceError as e:
        bar.end()
        fail(e)
    bar.end()
    if json_out:
        typer.echo(json.dumps(counts, indent=2))
        return
    err(f"wrote {out}: {counts['engines']} engine(s), {counts['charts']} charts, "
        f"{counts['findings']:,} findings, {counts['bytes']:,} bytes")
