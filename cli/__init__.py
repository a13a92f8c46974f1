"""The `vllm-contract` command: a thin typer layer over the recorder and replay APIs, one module
per command group. Data goes to stdout, diagnostics to stderr; unusable input exits 2 with one
line, no traceback: every command's TraceError is caught once, here (vllm_contract.cli.common)."""

from __future__ import annotations

import sys

import typer
import typer.core

from vllm_contract.cli import check, contract, export, live, reduce, replay, resim, trace, tui
from vllm_contract.cli import common
from vllm_contract.errors import TraceError


def _flag_type(self, ctx):
    # typer's rich help prints a flag's type (`<bool>`) in the column of the value an option
    # takes, where its plain help prints nothing: a flag takes no value
    return None if self.is_flag or self.count else _option_type(self, ctx)


_option_type = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = _flag_type


class _Commands(typer.core.TyperGroup):
    """The one error handler: what a command could not use (a TraceError it let escape) is one
    line on stderr and exit 2, whichever command it was, after its progress line is ended."""

    def invoke(self, ctx):
        common.LINES.clear()  # an earlier command's, run in this process (a test's CliRunner)
        try:
            return super().invoke(ctx)
        except TraceError as e:
            for line in common.LINES:
                line.end()
            common.fail(e)


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False, rich_markup_mode="markdown",
                  help="Record, check and replay the contract between vLLM's scheduler and "
                       "its workers.")
for group in (trace, check, live, replay, resim, reduce, export, contract, tui):
    app.add_typer(group.app)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
