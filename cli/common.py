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


def csv_text(rows: list[dict], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
