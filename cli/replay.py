"""`replay`: step a worker over a trace's recorded SchedulerOutputs and report where it would
raise or go wrong (the shadow worker), or where a real vLLM worker's tokens depart from the
recorded ones (`--worker vllm`)."""

from __future__ import annotations

import enum
import json
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import ExitCode, fail, quiet_vllm, warn
from vllm_contract.errors import TraceError

app = typer.Typer()


class Worker(str, enum.Enum):
    shadow = "shadow"
    vllm = "vllm"


class ReplayFormat(str, enum.Enum):
    table = "table"
    json = "json"
    jsonl = "jsonl"


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
    from vllm_contract.replay.session import Session

    if worker is Worker.vllm:
        _replay_real(trace, engine, from_, until, stop_at_first, force_recorded_tokens,
                     allow_crash, model, format)
        return
    if force_recorded_tokens or allow_crash or model is not None:
        warn("--force-recorded-tokens, --allow-crash and --model apply to --worker vllm only: "
             "ignored")
    try:
        from vllm_contract.trace import open_trace

        t = open_trace(trace)
        names = [e.name for e in t.engines] if engine is None else [engine]
        sessions = [Session(t, worker=worker.value, engine=n) for n in names]
    except TraceError as e:
        fail(e)
    lo = from_ if from_ is not None else -(2**63)
    hi = until if until is not None else 2**63 - 1
    found, replayed = [], 0
    stop = threading.Event()
    for s in sessions:
        end = sum(1 for st in s.steps if st <= hi)
        if not stop_at_first:
            s.goto(end, progress=_bar)
        else:
            while s.position < end and not stop.is_set():
                if any(lo <= f.step <= hi for f in s.step() if f.step is not None):
                    stop.set()
        replayed += s.position
        found.extend(f for f in s.findings if f.step is not None and lo <= f.step <= hi)
        if stop.is_set():
            break
    found.sort(key=lambda f: (f.step, f.engine or "", f.req_id or ""))
    if stop_at_first:
        found = found[:1]
    rows = [f.to_dict() for f in found]
    notes = list(dict.fromkeys(n for s in sessions for n in s.notes))
    if format is ReplayFormat.json:
        typer.echo(json.dumps({"worker": worker.value, "steps_replayed": replayed,
                               "first": rows[0] if rows else None, "findings": rows,
                               "divergences": [], "notes": notes}, indent=2))
    elif format is ReplayFormat.jsonl:
        for r in rows:
            typer.echo(json.dumps(r))
    else:
        for n in notes:
            typer.echo(f"note: {n}", err=True)
        for f in found:
            who = f" req {f.req_id}" if f.req_id else ""
            typer.echo(f"{f.severity.upper():7} {f.invariant}  step {f.step}{who}: "
                       f"{f.message.split(': ', 1)[-1]}")
        typer.echo(f"{replayed} step(s) replayed into the {worker.value} worker: "
                   f"{len(found)} finding(s)")
    if found:
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
    found = res.all_findings()
    if format is ReplayFormat.json:
        typer.echo(json.dumps(res.to_dict(), indent=2))
    elif format is ReplayFormat.jsonl:
        for f in found:
            typer.echo(json.dumps(f.to_dict()))
    else:
        for n in res.notes:
            typer.echo(f"note: {n}", err=True)
        if res.not_comparable:
            first = next(iter(res.not_comparable.items()))
            typer.echo(f"note: {len(res.not_comparable)} request(s) not compared token for "
                       f"token (e.g. {first[0]}: {first[1]}); --force-recorded-tokens keeps "
                       "their recorded context", err=True)
        for f in found:
            who = f" req {f.req_id}" if f.req_id else ""
            typer.echo(f"{f.severity.upper():7} {f.invariant}  step {f.step}{who}: {f.details}")
        if res.crash and res.crash.get("traceback"):
            typer.echo(res.crash["traceback"].rstrip(), err=True)
        typer.echo(f"{res.steps_replayed} of {len(p.steps)} step(s) replayed into a vLLM "
                   f"worker (engine {res.engine}): {len(res.divergences)} divergence(s), "
                   f"{len(res.findings)} other finding(s)")
    if found:
        raise typer.Exit(ExitCode.FOUND)
