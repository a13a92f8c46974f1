"""`resim`: re-run a real vLLM Scheduler on a recorded trace and diff its decisions with the
recording's, step by step (docs/resim.md)."""

from __future__ import annotations

import enum
import json
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import ExitCode, Progress, err, fail, quiet_vllm
from vllm_contract.errors import TraceError

app = typer.Typer()


class ResimFormat(str, enum.Enum):
    table = "table"
    json = "json"


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


def _table(summary, divergent: list) -> str:
    s = summary
    pct = 100.0 * s.identical_steps / s.steps if s.steps else 0.0
    lines = [f"engine {s.engine}, re-run with {s.scheduler_class}",
             f"{s.identical_steps:,} of {s.steps:,} steps identical ({pct:.1f} %)"]
    if s.stopped:
        lines.append(f"the re-run stopped there: {s.steps:,} of the recording's "
                     f"{s.recorded_steps:,} steps run")
    if s.until is not None:
        lines.append(f"stopped after step {s.until:,} (--until): {s.steps:,} of the "
                     f"recording's {s.recorded_steps:,} steps run")
    if s.quit_at is not None:
        lines.append(f"quit in the debugger at step {s.quit_at:,}: {s.steps:,} of the "
                     f"recording's {s.recorded_steps:,} steps run")
    if s.first is not None:
        lines.append(f"first divergence: {s.first.difference}")
        later = [r for r in divergent if r.step != s.first.step]
        if later:
            lines.append(f"{len(later):,} more divergent step(s), the next: {later[0].difference}")
    rec = s.recorded
    if rec is not None:
        lines.append(f"the re-run recorded in {rec.trace}: the catalog finds {rec.errors:,} "
                     f"error(s), {rec.warnings:,} warning(s)"
                     + (f" (first: {rec.findings[0]})" if rec.findings else ""))
    return "\n".join(lines) + "\n"


def _whatif_table(summary, kept: bool) -> str:
    """A what-if run: the comparison with the recording, side by side."""
    from vllm_contract.replay.resim.whatif import table

    s = summary
    lines = [f"engine {s.engine}, what-if run with {s.scheduler_class}",
             f"{s.steps:,} step(s) run (the recording has {s.recorded_steps:,}); "
             f"{s.identical_steps:,} identical to the recording's step of the same index"]
    if s.first is not None:
        lines.append(f"first divergence: {s.first.difference}")
    if s.stopped:
        lines.append("the re-run's scheduler raised: the measures are up to there")
    if s.quit_at is not None:
        lines.append(f"quit in the debugger at step {s.quit_at:,}")
    if s.whatif is not None:
        lines += table(s.whatif)
    rec = s.recorded
    if rec is not None:
        lines.append((f"the re-run recorded in {rec.trace}" if kept else
                      "the re-run checked in a scratch trace (--out NEW_TRACE keeps it)")
                     + (f" (first finding: {rec.findings[0]})" if rec.findings else ""))
    return "\n".join(lines) + "\n"


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
    from vllm_contract.replay.resim import resim as run_resim

    bar = Progress()
    whatif = bool(set_) or scheduler_cls is not None
    # a what-if run's verdict is the catalog's on the re-run: without --out it is recorded
    # into a trace of its own that goes when the command ends
    scratch = tempfile.TemporaryDirectory(prefix="vllm-contract-resim-") if (
        whatif and out is None) else None
    try:
        try:
            hook = _hook(break_hook, bar) if break_at is not None else break_hook
            run = run_resim(trace, engine, scheduler_cls, _settings(set_ or []) or None,
                            break_at=break_at, break_hook=hook, until=until,
                            out=out if scratch is None else Path(scratch.name) / "rerun",
                            whatif=whatif, arrivals=arrivals)
        except TraceError as e:
            fail(e)
        _run(run, bar, whatif, format, kept=scratch is None)
    finally:
        if scratch is not None:
            scratch.cleanup()


def _run(run, bar: Progress, whatif: bool, format: ResimFormat, kept: bool) -> None:
    for note in run.notes:
        err(f"vllm-contract: note: {note}")
    total, divergent = run.total_steps, []
    try:
        for i, r in enumerate(run, 1):
            if not r.identical:
                divergent.append(r)
            done = min(i, total)  # a what-if run may take more steps than the recording
            bar.show(f"re-running [{'#' * (30 * done // total)}{'.' * (30 - 30 * done // total)}]"
                     f" {i}/{total}")
    except TraceError as e:
        bar.end()
        fail(e)
    bar.end()
    s = run.summary
    if format is ResimFormat.json:
        out = s.as_dict()
        if not kept and out.get("out"):
            out["out"]["trace"] = None  # the scratch trace is gone with the command
        out["divergent_steps"] = [r.step for r in divergent]
        typer.echo(json.dumps(out, indent=2))
    elif whatif:
        typer.echo(_whatif_table(s, kept), nl=False)
    else:
        typer.echo(_table(s, divergent), nl=False)
    if whatif:
        found = s.recorded is not None and bool(s.recorded.errors or s.recorded.warnings)
        if found or s.stopped:
            raise typer.Exit(ExitCode.FOUND)
    elif not s.identical:
        raise typer.Exit(ExitCode.FOUND)
