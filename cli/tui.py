"""`tui`: the Textual app over a trace (tui/). The trace is opened before the app starts, so
that a bad one is the same one line and exit 2 as with every other command."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Annotated

import typer
from vllm_contract.cli.common import fail, quiet_vllm, warn, worker_choice
from vllm_contract.errors import TraceError

app = typer.Typer()

TuiWorker = worker_choice("TuiWorker")  # the registry's kinds


@app.command()
def tui(
    trace: Annotated[Path, typer.Argument(help="Trace directory.")],
    worker: Annotated[TuiWorker, typer.Option("--worker", help="The worker the replay pane "
                                              "steps.")] = TuiWorker["shadow"],
    engine: Annotated[str | None, typer.Option("--engine", help="Engine directory name "
                                                  "(default: the first).")] = None,
    step: Annotated[int | None, typer.Option("--step", help="Start at this step.")] = None,
    finding: Annotated[str | None, typer.Option(
        "--finding", help="Start at the first finding of this invariant id, or at the N-th "
                          "finding (1 = the first listed).")] = None,
    model: Annotated[Path | None, typer.Option(
        "--model", help="Real worker only: a copy of the trace's model, when the path its "
        "manifest names is not there.")] = None,
) -> None:
    """Step through a trace and its replay, like a debugger (keys: press ? in the app)."""
    if step is not None and finding is not None:
        fail("--step and --finding are alternatives: give one")
    from vllm_contract.replay import WorkerOptions, worker_class

    kind = worker_class(worker.value)
    if kind.compares_tokens:
        quiet_vllm()  # vLLM's log would write over the app's screen
    from vllm_contract.tui import checks
    from vllm_contract.tui.app import ContractApp
    from vllm_contract.tui.data import TraceData

    if finding is not None and not finding.isdigit() and not finding.startswith(
            "worker.") and finding not in checks.known_ids():
        raise TraceError(f"unknown invariant {finding!r} (see `vllm-contract check --list`)")
    data = TraceData(trace, engine)
    try:  # e.g. a model it cannot load: one line now, not once the app runs
        kind.precheck(data.gateway.trace, data.engine,
                      WorkerOptions(model=None if model is None else str(model)))
    except TraceError:
        data.close()
        raise
    for w in data.gateway.warnings:
        warn(w)
    try:
        ContractApp(data, worker=worker.value, step=step, finding=finding,
                    model=None if model is None else str(model)).run()
    finally:
        data.close()
        # The process ends here: the collector's passes at interpreter exit would scan every
        # object the app made, most of a quit's time, and nothing is left to collect.
        gc.freeze()
