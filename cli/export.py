"""`export` and `report`: a trace as a timeline another tool opens (docs/timeline.md), and as
one HTML page (docs/report.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import JsonAlias, chosen, emit, fail, format_choice, progress_line

app = typer.Typer()

# the options both commands take: which steps, which engine
First = Annotated[Optional[int], typer.Option("--from", help="The first step drawn.")]
Last = Annotated[Optional[int], typer.Option("--until", help="The last step drawn.")]
Engine = Annotated[Optional[str], typer.Option("--engine", help="Only this engine (default "
                                               "all: a process, or a section, each).")]
# what was written: a line on stderr (table), or its counts as JSON on stdout
ExportFormat = format_choice("ExportFormat", "export")
ReportFormat = format_choice("ReportFormat", "report")


@app.command()
def export(
    trace: Annotated[Path, typer.Argument(help="Trace directory (a root: every engine).")],
    perfetto: Annotated[Path, typer.Option("--perfetto", metavar="OUT.pftrace", help="Write a "
                                           "Perfetto timeline (TrackEvent protobuf) there: "
                                           "open it in ui.perfetto.dev.")],
    first: First = None,
    last: Last = None,
    engine: Engine = None,
    format: Annotated[ExportFormat, typer.Option("--format", "-f")] = ExportFormat.table,
    json_out: JsonAlias = False,
) -> None:
    """A timeline of the trace: per engine a process with a track of steps (with their counts
    as arguments), counters (tokens per step, running, waiting, KV usage, schedule() time),
    request lanes (waiting, prefill, decode, preempted, flows from a preemption to its resume)
    and every finding of the catalog as an instant event on its step and request."""
    from vllm_contract.replay.timeline.perfetto import export as run_export

    if perfetto.exists() and perfetto.is_dir():
        fail(f"--perfetto {perfetto} is a directory: give a file name")
    bar = progress_line("exporting: {n:,} of {total:,} steps")
    counts = run_export(trace, perfetto, engine=engine, first=first, last=last, progress=bar)
    bar.end()
    from vllm_contract.replay.export import render

    emit(render("export", chosen(format, json_out), counts, perfetto))


@app.command()
def report(
    trace: Annotated[Path, typer.Argument(help="Trace directory (a root: every engine).")],
    out: Annotated[Path, typer.Option("--out", metavar="REPORT.html", help="The page to write: "
                                      "one file, everything inline (opens offline).")],
    first: First = None,
    last: Last = None,
    engine: Engine = None,
    format: Annotated[ReportFormat, typer.Option("--format", "-f")] = ReportFormat.table,
    json_out: JsonAlias = False,
) -> None:
    """A self-contained HTML page to attach to a bug report: `info`'s summary, the findings
    with their why and the vLLM code they rely on, and charts of tokens per step, batch size,
    KV usage, queue lengths, schedule() time, the requests' lanes and their time to first
    token and duration in steps."""
    from vllm_contract.replay.timeline.report import write

    if out.exists() and out.is_dir():
        fail(f"--out {out} is a directory: give a file name")
    bar = progress_line(every=2.0)
    counts = write(trace, out, engine=engine, first=first, last=last, progress=bar.show)
    bar.end()
    from vllm_contract.replay.export import render

    emit(render("report", chosen(format, json_out), counts, out))
