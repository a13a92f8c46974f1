"""`reduce`: a recording with a finding cut down to the fewest requests and steps whose
re-run by the scheduler still shows it (docs/reduce.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import (ExitCode, JsonAlias, chosen, emit, err, format_choice,
                                      progress_line, quiet_vllm)

app = typer.Typer()


ReduceFormat = format_choice("ReduceFormat", "reduce")


@app.command()
def reduce(
    trace: Annotated[Path, typer.Argument(help="Trace directory (format 3: an input log).")],
    finding: Annotated[str, typer.Option("--finding", metavar="INVARIANT",
                                         help="The catalog invariant whose finding to keep.")],
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="A new directory: the "
                                      "reduced trace (DIR/trace) and its report (DIR/README.md)."
                                      )],
    step: Annotated[Optional[int], typer.Option("--step", help="The finding at this step of "
                                                "the recording (of several).")] = None,
    req: Annotated[Optional[str], typer.Option("--req", metavar="ID", help="The finding on "
                                               "this request, kept in every candidate.")] = None,
    scheduler_cls: Annotated[Optional[str], typer.Option(
        "--scheduler-cls", metavar="MODULE:CLASS", help="The scheduler the finding is blamed "
        "on (a patched or buggy one); default the installed vLLM's.")] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", help="Engine name (needed when "
                                                  "the trace has several).")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Re-run this many candidates side "
                                      "by side, in processes of their own (the result is the "
                                      "one-at-a-time one).")] = 1,
    max_seconds: Annotated[Optional[float], typer.Option(
        "--max-seconds", help="Stop after this long with the best reduction so far.")] = None,
    format: Annotated[ReduceFormat, typer.Option("--format", "-f")] = ReduceFormat.table,
    json_out: JsonAlias = False,
) -> None:
    """Reduce a recording to a small one that still has FINDING when the scheduler re-runs
    it: whole requests are taken out (with their aborts), then the steps after the finding.
    Ctrl-C or --max-seconds keeps the best so far. Exit 0: reduced; 2: unusable input, or a
    finding that the re-run does not show (not the scheduler's doing)."""
    quiet_vllm()
    from vllm_contract.replay.resim.reduce import reduce as run_reduce

    bar = progress_line()
    try:
        result = run_reduce(trace, finding, out, engine=engine, scheduler_cls=scheduler_cls,
                            step=step, req=req, max_seconds=max_seconds, jobs=jobs,
                            progress=bar.show)
    except KeyboardInterrupt:
        bar.end()
        err("vllm-contract: interrupted in the first re-run, before there was a reduction to "
            "keep: nothing written")
        raise typer.Exit(ExitCode.INTERRUPTED)
    bar.end()
    from vllm_contract.replay.export import render

    emit(render("reduce", chosen(format, json_out), result, out))
