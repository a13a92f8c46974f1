"""The modal screens: help (every key, from keys.py) and go to step N."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static
from vllm_contract.tui.keys import KEYS, PANE_KEYS


def help_table() -> Table:
    table = Table(title="vllm-contract tui: keys", expand=True)
    table.add_column("key", style="bold cyan", no_wrap=True)
    table.add_column("does")
    table.add_column("where", style="dim")
    for k in KEYS:
        table.add_row(k.label or k.keys, k.description, k.group)
    for keys, what, group in PANE_KEYS:
        table.add_row(keys, what, group)
    table.add_row("mouse", "click a step, a tab, a finding or a lifeline event; wheel scrolls",
                  "App")
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list] = [("escape,question_mark,q", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 90; height: auto; max-height: 90%; border: thick $primary;
                            background: $surface; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(help_table(), id="help-keys")
            yield Static("Esc or ? closes", classes="dim")


class GotoScreen(ModalScreen[int | None]):
    BINDINGS: ClassVar[list] = [("escape", "dismiss", "cancel")]
    DEFAULT_CSS = """
    GotoScreen { align: center middle; }
    GotoScreen > Vertical { width: 40; height: auto; border: thick $primary;
                            background: $surface; }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("go to step:")
            yield Input(id="goto-input", type="integer")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            self.dismiss(int(event.value))
        except ValueError:
            self.dismiss(None)
