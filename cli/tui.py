"""`tui`: the Textual app over a trace (tui/). The trace is opened before the app starts, so
that a bad one is the same one line and exit 2 as with every other command."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from vllm_contract.cli.common import fail, warn
from vllm_contract.errors import TraceError

app = typer.Typer()


class TuiWorker(str, enum.Enum):
    shadow = "shadow"
    vllm = "vllm"


@app.command()
def tui(
    trace: Annotated[Path, typer.Argument(help="Trace directory.")],
    worker: Annotated[TuiWorker, typer.Option("--worker", help="The worker the replay pane "
                                              "steps.")] = TuiWorker.shadow,
    engine: Annotated[str | None, typer.Option("--engine", help="Engine directory name "
                                                  "(default: the first).")] = None,
    step: Annotated[int | None, typer.Option("--step", help="Start at this step.")] = None,
    finding: Annotated[str | None, typer.Option(
        "--finding", help="Start at the first finding of this invariant id, or at the N-th "
                          "finding (1 = the first listed).")] = None,
) -> None:
    """Step through a trace and its replay, like a debugger (keys: press ? in the app)."""
    if step is not None and finding is not None:
        fail("--step and --finding are alternatives: give one")
    from vllm_contract.tui import checks
    from vllm_contract.tui.app import ContractApp
    from vllm_contract.tui.data import TraceData

    try:
        if finding is not None and not finding.isdigit() and not finding.startswith(
                "worker.") and finding not in checks.known_ids():
            raise TraceError(f"unknown invariant {finding!r} (see `vllm-contract check --list`)")
        data = TraceData(trace, engine)
    except TraceError as e:
        fail(e)
    for w in data.gateway.warnings:
        warn(w)
    try:
        ContractApp(data, worker=worker.value, step=step, finding=finding).run()
    finally:
        data.close()
