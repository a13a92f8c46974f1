"""What every command shares: exit codes, the one-line error, warnings, printing what an
exporter rendered (vllm_contract.replay.export) and the --format choices it offers."""

from __future__ import annotations

import enum
from typing import NoReturn

import typer


class ExitCode(enum.IntEnum):
    OK = 0
    FOUND = 1  # findings at or above --fail-on, or a recording that failed
    UNUSABLE = 2  # bad input or usage: one line on stderr, no traceback


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
    plain lines, at most one every `every` seconds, and the last one at the end."""

    def __init__(self, every: float = 10.0) -> None:
        import sys

        self.tty = sys.stderr.isatty()
        self.every = every
        self.shown = False
        self.pending: str | None = None
        self._at = float("-inf")

    def show(self, text: str) -> None:
        import time

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


def emit(rendered) -> None:
    """Print what an exporter rendered: each chunk to stdout or stderr, in order."""
    for text, to_err in rendered.chunks:
        typer.echo(text, err=to_err, nl=False)
