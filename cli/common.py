"""What every command shares: exit codes, the one-line error, warnings, CSV."""

from __future__ import annotations

import csv
import enum
import io
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


def csv_text(rows: list[dict], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
