"""`replay`: step a worker over a trace's recorded SchedulerOutputs and report where it would
raise or go wrong (the shadow worker), or where a real vLLM worker's tokens depart from the
recorded ones (`--worker vllm`). The worker kinds are the registry's
(vllm_contract.replay.worker.registry)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import (ExitCode, emit, format_choice, progress_line, quiet_vllm,
                                      warn, worker_choice)
from vllm_contract.replay.export import render

app = typer.Typer()

WorkerName = worker_choice("WorkerName")
# the formats the exporters have (vllm_contract.replay.export), the same for every worker
ReplayFormat = format_choice("ReplayFormat", "replay")


@app.command()
def replay(
    trace: Annotated[Path, typer.Argument(help="Trace directory.")],
    worker: Annotated[WorkerName, typer.Option("--worker", help="Which worker to replay into.")]
    = WorkerName["shadow"],
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
    from vllm_contract.replay.worker.base import WorkerOptions
    from vllm_contract.replay.worker.registry import worker_class

    kind = worker.value
    cls = worker_class(kind)
    if cls.compares_tokens:
        quiet_vllm()
    elif force_recorded_tokens or allow_crash or model is not None:
        warn(f"--force-recorded-tokens, --allow-crash and --model apply to a worker that runs "
             f"the model only (--worker {kind} does not): ignored")
    options = WorkerOptions(model=None if model is None else str(model),
                            force_recorded_tokens=force_recorded_tokens, allow_crash=allow_crash)
    line = progress_line("replaying {bar} {n}/{total}", tty_only=True)
    run = replay_range(trace, kind, engine, from_, until, stop_at_first, progress=line,
                       options=options)
    line.end()
    emit(render("replay", format.value, run))
    if run.all_findings():
        raise typer.Exit(ExitCode.FOUND)
