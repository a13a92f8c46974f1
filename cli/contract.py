"""`contract`: the installed vLLM's contract dataclasses against another field set
(docs/contract.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import ExitCode, emit, fail, format_choice, quiet_vllm

app = typer.Typer()

# the seed excerpt beside the checkout (../shared/seeds/), as the project was given it
SEEDS = Path(__file__).resolve().parents[1] / ".." / "shared" / "seeds"


Format = format_choice("Format", "contract")


@app.command()
def contract(
    against: Annotated[Optional[str], typer.Option(
        "--against", metavar="seed|TRACE|FIELDS.json",
        help="What to diff the installed vLLM against: the seed excerpt of vLLM's source (the "
             "default), a trace's recorded field sets, or a file `--dump` wrote.")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f")] = Format("oneline"),
    dump: Annotated[bool, typer.Option("--dump", help="Print the installed field sets as JSON "
                                       "(a file for a later --against) and stop.")] = False,
    seeds: Annotated[Path, typer.Option("--seeds", help="Where the seed excerpts are.",
                                        show_default=False)] = SEEDS,
) -> None:
    """The fields of every dataclass the trace format depends on (SchedulerOutput,
    NewRequestData, CachedRequestData, ModelRunnerOutput, the Request arguments resim gives) in
    the installed vLLM, diffed against another field set; each change classified (added,
    removed, renamed, type changed) and rated by what it breaks here (recording, check, replay,
    resim). Exit 0: no change that breaks something; 1: some; 2: unusable input."""
    quiet_vllm()
    from vllm_contract.replay import contract as c

    if dump and against is not None:
        fail("--dump prints the installed field sets: give it without --against")
    try:
        now = c.installed()
    except ImportError as e:
        fail(f"vLLM is not importable here: {e}")
    if dump:
        typer.echo(json.dumps(now.as_dict(), indent=2))
        return
    before = c.load(against or "seed", seeds.resolve())
    changes = c.diff(before, now)
    from vllm_contract.replay.export import render

    emit(render("contract", fmt.value, changes, before, now))
    if any(ch.breaks for ch in changes):
        raise typer.Exit(ExitCode.FOUND)
