"""What every command shares: exit codes, the one-line error, warnings, the progress line,
printing what an exporter rendered (vllm_contract.replay.export) and the --format choices it
offers. A TraceError a command lets escape is the one-line error (the app's group in
cli/__init__.py catches it), so commands do not catch it themselves."""

from __future__ import annotations

import enum
from typing import Annotated, NoReturn

import typer


class ExitCode(enum.IntEnum):
    OK = 0
    FOUND = 1  # findings at or above --fail-on, or a recording that failed
    UNUSABLE = 2  # bad input or usage: one line on stderr, no traceback
    INTERRUPTED = 130  # Ctrl-C before there was anything to keep (128 + SIGINT, as a shell says)


def err(msg: str) -> None:
    typer.echo(msg, err=True)


def warn(msg: str) -> None:
    err(f"vllm-contract: warning: {msg}")


def fail(msg: object) -> NoReturn:
    """Unusable input: one line on stderr, exit 2."""
    err(f"vllm-contract: error: {msg}")
    raise typer.Exit(ExitCode.UNUSABLE)


class Progress:
    """Progress on stderr: one line redrawn on a terminal; into a file or a pipe (a CI log),
    plain lines, at most one every `every` seconds, and the last one at the end, or with
    `tty_only` nothing. Called as `(n, total)` (and a name, for `{name}`), it shows `fmt`
    filled in: `{n}`, `{total}`, `{name}` and `{bar}`, a bar of 30 that a count past the total
    leaves full."""

    def __init__(self, every: float = 10.0, fmt: str = "{n}/{total}",
                 tty_only: bool = False) -> None:
        import sys

        self.tty = sys.stderr.isatty()
        self.off = tty_only and not self.tty
        self.every = every
        self.fmt = fmt
        self.shown = False
        self.pending: str | None = None
        self._at = float("-inf")

    def __call__(self, n: int, total: int, name: str = "") -> None:
        bar = ""
        if "{bar" in self.fmt:
            if total <= 0:  # nothing to draw a share of
                return
            done = 30 * min(n, total) // total
            bar = f"[{'#' * done}{'.' * (30 - done)}]"
        self.show(self.fmt.format(n=n, total=total, name=name, bar=bar))

    def show(self, text: str) -> None:
        import time

        if self.off:
            return
        if self.tty:
            typer.echo(f"\r{text}", err=True, nl=False)
            self.shown = True
            return
        now = time.monotonic()
        if now - self._at >= self.every:
            err(text)
            self._at, self.pending = now, None
        else:
            self.pending = text

    def end(self) -> None:
        """Ends the line on a terminal (so that what follows starts its own); elsewhere the
        last state not yet written."""
        if self.tty and self.shown:
            typer.echo("", err=True)
        elif self.pending is not None:
            err(self.pending)
        self.shown, self.pending = False, None


# the running command's progress lines: the one error handler ends them before its line
LINES: list[Progress] = []


def progress_line(fmt: str = "{n}/{total}", *, every: float = 10.0,
                  tty_only: bool = False) -> Progress:
    """The progress of a command: call it with `(n, total)` (or `.show(text)` a line of its
    own), and `.end()` it before printing what follows. A command need not catch a TraceError
    to end it: the error handler does."""
    line = Progress(every, fmt, tty_only)
    LINES.append(line)
    return line


def quiet_vllm() -> None:
    """Before vLLM is first imported by a command that builds an engine: its log goes to stderr,
    since stdout carries the command's data (JSON must parse), and, unless the user chose a
    level with VLLM_LOGGING_LEVEL, only its errors (its start-up warnings, among them a
    traceback about the tokenizer a replay does without, read like our failure)."""
    import os
    import warnings

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
        # torch deprecations vLLM trips on import
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


def format_choice(name: str, kind: str) -> type[enum.Enum]:
    """The --format choices of a command: the formats the exporters have for `kind`, in the
    order they were registered."""
    from vllm_contract.replay.export import formats

    return enum.Enum(name, {f: f for f in formats(kind)}, type=str)


def worker_choice(name: str) -> type[enum.Enum]:
    """The --worker choices of a command: the worker kinds the registry names, in its order."""
    from vllm_contract.replay.worker.registry import names

    return enum.Enum(name, {w: w for w in names()}, type=str)


# `--json`, from before the commands took --format: still `--format json`, left out of --help
JsonAlias = Annotated[bool, typer.Option("--json", hidden=True,
                                         help="Deprecated: --format json.")]


def chosen(fmt: enum.Enum, json_alias: bool) -> str:
    """The format a command was given, its deprecated `--json` included."""
    return "json" if json_alias else fmt.value


def emit(rendered) -> None:
    """Print what an exporter rendered: each chunk to stdout or stderr, in order."""
    for text, to_err in rendered.chunks:
        typer.echo(text, err=to_err, nl=False)
