"""`replay`: step a worker over a trace's recorded SchedulerOutputs and report where it would
raise or go wrong (the shadow worker), or where a real vLLM worker's tokens depart from the
recorded ones (`--worker vllm`)."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import ExitCode, emit, fail, format_choice, quiet_vllm, warn
from vllm_contract.errors import TraceError
from vllm_contract.replay.export import render

app = typer.Typer()


class Worker(str, enum.Enum):
    shadow = "shadow"
    vllm = "vllm"


# the formats the exporters have (vllm_contract.replay.export), the same for either worker
ReplayFormat = format_choice("ReplayFormat", "replay")


def _bar(n: int, total: int) -> None:
    """A progress bar on a terminal; nothing when stderr is a file or a pipe."""
    if not sys.stderr.isatty() or total <= 0:
        return
    done = 30 * n // total
    typer.echo(f"\rreplaying [{'#' * done}{'.' * (30 - done)}] {n}/{total}", err=True, nl=False)
    if n == total:
        typer.echo("", err=True)


@app.command()
def replay(
    trace: Annotated[Path, typer.Argument(help="Trace directory.")],
    worker: Annotated[Worker, typer.Option("--worker", help="Which worker to replay into.")]
    = Worker.shadow,
    engine: Annotated[Optional[str], typer.Option("--engine", help="Engine name "
                                                  "(default: every engine).")] = None,
    from_: Annotated[Optional[int], typer.Option("--from", help="First step to report "
                                                 "(earlier steps are still applied).")] = None,
    until: Annotated[Optional[int], typer.Option("--until", help="Last step to apply.")] = None,
    stop_at_first: Annotated[bool, typer.Option("--stop-at-first",
                                                help="Stop at the first finding.")] = False,
    force_recorded_tokens: Annotated[bool, typer.Option(
        "--force-recorded-tokens", help="Real worker only: feed the recorded tokens.")] = False,
    allow_crash: Annotated[bool, typer.Option(
        "--allow-crash", help="Real worker only: report a crash as a finding.")] = False,
    model: Annotated[Optional[Path], typer.Option(
        "--model", help="Real worker only: a copy of the trace's model, when the path its "
        "manifest names is not there.")] = None,
    format: Annotated[ReplayFormat, typer.Option("--format", "-f")] = ReplayFormat.table,
) -> None:
    """Replay a trace into a worker. Exit 0: nothing found; 1: a finding or divergence;
    2: unusable input. With --worker vllm, --from is the step the worker starts at (a real
    worker cannot skip the steps before it)."""
    from vllm_contract.replay.stepping import replay_range

    if worker is Worker.vllm:
        _replay_real(trace, engine, from_, until, stop_at_first, force_recorded_tokens,
                     allow_crash, model, format)
        return
    if force_recorded_tokens or allow_crash or model is not None:
        warn("--force-recorded-tokens, --allow-crash and --model apply to --worker vllm only: "
             "ignored")
    try:
        run = replay_range(trace, worker.value, engine, from_, until, stop_at_first,
                           progress=_bar)
    except TraceError as e:
        fail(e)
    emit(render("replay", format.value, run))
    if run.findings:
        raise typer.Exit(ExitCode.FOUND)


def _replay_real(trace: Path, engine: str | None, start: int | None, until: int | None,
                 stop_at_first: bool, force: bool, allow_crash: bool, model: Path | None,
                 format: ReplayFormat) -> None:
    from vllm_contract.replay.worker import real_run
    from vllm_contract.trace import open_trace

    quiet_vllm()
    model_path = None if model is None else str(model)
    try:
        t = open_trace(trace)
        p = real_run.prepare(t, engine, model_path, start, until)
        if allow_crash:
            res = real_run.run_in_child(p, str(t.root), model_path, start, until, force,
                                        stop_at_first, progress=_bar)
        else:
            res = real_run.run_here(p, force, False, stop_at_first, progress=_bar)
    except TraceError as e:
        fail(e)
    emit(render("real-replay", format.value, res, planned=len(p.steps)))
    if res.all_findings():
        raise typer.Exit(ExitCode.FOUND)
