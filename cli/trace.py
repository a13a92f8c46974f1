"""`info`, `compact`, `demo`: one trace as a whole."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import emit, format_choice, progress_line, warn

app = typer.Typer()


# the formats the exporters have (vllm_contract.replay.export)
InfoFormat = format_choice("InfoFormat", "info")


def _open(path: Path):
    from vllm_contract.trace import open_trace

    return open_trace(path)


@app.command()
def info(trace: Annotated[Path, typer.Argument(help="Trace directory (a root or one engine).")],
         format: Annotated[InfoFormat, typer.Option("--format", "-f")] = InfoFormat.table,
         views: Annotated[bool, typer.Option(
             "--views", help="Also count the rows of the derived views (lifeline, runs, ...): "
                             "on a long trace that costs what a check does.")] = False) -> None:
    """Manifest, step and request counts, time span, batches in flight, vLLM version, fields
    seen, integrity."""
    from vllm_contract.replay.query.gateway import Gateway
    from vllm_contract.replay.query.summary import summary

    t = _open(trace)
    # the SQL views `sql` and `check` see, all engines together
    with Gateway(t, derived=views) as gw:
        s = summary(t, gw)  # its integrity checks are `check`'s
        s["views"] = gw.counts(derived=views)
    for e in s["engines"]:
        for w in e["warnings"]:
            warn(w)
    from vllm_contract.replay.export import render

    emit(render("info", format.value, s))


@app.command()
def compact(trace: Annotated[Path, typer.Argument(help="Trace directory.")]) -> None:
    """Turn closed stream segments into Parquet (zstd); the newest segment of a live recorder
    is left alone."""
    from vllm_contract.recorder.compact import compact as do_compact, segment_count

    t = _open(trace)
    total = segment_count(t)
    done = [0]
    line = progress_line("compacting {n}/{total}")

    def one_more(path: Path) -> None:
        done[0] += 1
        line(done[0], total)

    try:
        stats = do_compact(t, one_more)
    finally:  # Ctrl-C too
        line.end()
    if t.source is not None:  # compacted in a local copy: the remote trace takes it
        from vllm_contract import remote

        pushed = remote.push(t.root, t.source)
        typer.echo(f"{t.source}: {pushed['uploaded']} file(s) written, "
                   f"{pushed['deleted']} deleted", err=True)
    for w in t.warnings + t.problems:
        warn(w)
    before, after = stats["bytes_before"], stats["bytes_after"]
    typer.echo(f"compacted {stats['compacted']} segment(s): {before} → {after} bytes"
               + (f"; left {stats['skipped_live']} live segment(s)" if stats["skipped_live"] else ""))


@app.command()
def demo(out: Annotated[Path, typer.Option(help="Where to write the trace.")] = Path("demo-trace"),
         model: Annotated[Optional[Path], typer.Option(help="Model dir (default: the tiny "
                                                       "local Llama, built if missing).")] = None,
         ) -> None:
    """Run a real vLLM engine on the CPU with recording on, over a workload with chunked
    prefill, an abort and preemption; then summarise the trace."""
    from vllm_contract.rig import demo as demo_mod

    demo_mod.main(out, model)
