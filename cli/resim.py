"""`resim`: re-run a real vLLM Scheduler on a recorded trace and diff its decisions with the
recording's, step by step (docs/resim.md)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import (ExitCode, Progress, emit, err, fail, format_choice,
                                      progress_line, quiet_vllm)

app = typer.Typer()


ResimFormat = format_choice("ResimFormat", "resim")


def _settings(pairs: list[str]) -> dict:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            fail(f"--set {p!r}: expected key=value")
        try:
            out[key] = json.loads(value)
        except ValueError:  # a path or a word: the text itself
            out[key] = value
    return out


def _hook(spec: Optional[str], bar: Progress):
    """The break hook, with the progress line ended before it speaks (pdb's prompt, say)."""
    from vllm_contract.replay.resim.debug import hook_of

    hook = hook_of(spec)

    def stop(brk) -> None:
        bar.end()
        hook(brk)

    return stop


@app.command()
def resim(
    trace: Annotated[Path, typer.Argument(help="Trace directory.")],
    engine: Annotated[Optional[str], typer.Option("--engine", help="Engine name (needed when "
                                                  "the trace has several).")] = None,
    scheduler_cls: Annotated[Optional[str], typer.Option(
        "--scheduler-cls", help="module:Class of the scheduler to re-run (default: the "
        "installed vLLM's Scheduler, or AsyncScheduler where the recording had batches in "
        "flight).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", help="key=value: change a recorded engine setting (model, block_size, "
        "num_kv_blocks, max_num_batched_tokens, ...); divergence is then expected.")] = None,
    break_at: Annotated[Optional[int], typer.Option(
        "--break-at", metavar="STEP", help="Stop just before this step's schedule() in pdb "
        "(PYTHONBREAKPOINT is honoured), with scheduler, pending and recorded in reach.")] = None,
    break_hook: Annotated[Optional[str], typer.Option(
        "--break-hook", metavar="MODULE:FUNCTION", help="Call this with the stop (a "
        "replay.resim.debug.Break) instead of pdb; needs --break-at.")] = None,
    until: Annotated[Optional[int], typer.Option(
        "--until", metavar="STEP", help="Stop the re-run after this step.")] = None,
    out: Annotated[Optional[Path], typer.Option(
        "--out", metavar="NEW_TRACE", help="Record the re-run into a new trace there (check, "
        "sql, replay and tui open it) and run the catalog on it.")] = None,
    arrivals: Annotated[str, typer.Option(
        "--arrivals", metavar="step|time", help="What-if runs: add each request at the "
        "recording's step index (step), or when its recorded arrival time comes on a clock "
        "advanced by the recorded step durations (time; needs the input log).")] = "step",
    format: Annotated[ResimFormat, typer.Option("--format", "-f")] = ResimFormat.table,
) -> None:
    """Re-run the scheduler on a trace's recorded inputs, with no model and no worker, and
    compare each SchedulerOutput with the recorded one. Exit 0: every step identical;
    1: a step diverged; 2: unusable input. With --set or --scheduler-cls, a what-if run:
    divergence is expected, the re-run goes on until every request has finished and is
    compared with the recording side by side; exit 0: the re-run has no error or warning
    finding (--out), 1: it has, or its scheduler raised."""
    quiet_vllm()
    from vllm_contract.replay.resim import ResimOptions
    from vllm_contract.replay.resim import resim as run_resim

    bar = progress_line("re-running {bar} {n}/{total}")
    whatif = bool(set_) or scheduler_cls is not None
    # a what-if run's verdict is the catalog's on the re-run: without --out it is recorded
    # into a trace of its own that goes when the command ends
    scratch = tempfile.TemporaryDirectory(prefix="vllm-contract-resim-") if (
        whatif and out is None) else None
    try:
        hook = _hook(break_hook, bar) if break_at is not None else break_hook
        run = run_resim(trace, ResimOptions(
            engine=engine, scheduler_cls=scheduler_cls,
            overrides=_settings(set_ or []) or None, break_at=break_at, break_hook=hook,
            until=until, out=out if scratch is None else Path(scratch.name) / "rerun",
            whatif=whatif, arrivals=arrivals))
        _run(run, bar, whatif, format, kept=scratch is None)
    finally:
        if scratch is not None:
            scratch.cleanup()


def _run(run, bar: Progress, whatif: bool, format: ResimFormat, kept: bool) -> None:
    for note in run.notes:
        err(f"vllm-contract: note: {note}")
    total, divergent = run.total_steps, []
    for i, r in enumerate(run, 1):
        if not r.identical:
            divergent.append(r)
        bar(i, total)  # a what-if run may take more steps than the recording: a full bar
    bar.end()
    s = run.summary
    from vllm_contract.replay.export import render

    emit(render("resim", format.value, s, divergent, whatif=whatif, kept=kept))
    if whatif:
        found = s.recorded is not None and bool(s.recorded.errors or s.recorded.warnings)
        if found or s.stopped:
            raise typer.Exit(ExitCode.FOUND)
    elif not s.identical:
        raise typer.Exit(ExitCode.FOUND)
