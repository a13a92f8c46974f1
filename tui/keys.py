"""Every key of the app, in one table: the app's BINDINGS and the help screen are both made
from it, so the help cannot drift from what the keys do."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Key:
    keys: str  # Textual's comma-separated key names
    action: str
    description: str
    group: str
    footer: bool = False
    label: str = ""  # how the help screen writes the keys, when not as Textual names them


KEYS: tuple[Key, ...] = (
    Key("down,j", "move(1)", "next step", "Steps", label="↓ j"),
    Key("up,k", "move(-1)", "previous step", "Steps", label="↑ k"),
    Key("pagedown,ctrl+f", "page(1)", "page down", "Steps", label="PgDn ctrl+f"),
    Key("pageup,ctrl+b", "page(-1)", "page up", "Steps", label="PgUp ctrl+b"),
    Key("home,g", "first", "first step", "Steps", label="Home g"),
    Key("end,G", "last", "last step", "Steps", label="End G"),
    Key("colon", "goto_prompt", "go to step N", "Steps", footer=True, label=":"),
    Key("n", "finding(1)", "next step with a finding", "Steps", footer=True),
    Key("N", "finding(-1)", "previous step with a finding", "Steps", label="N (shift+n)"),
    Key("d", "show('detail')", "step detail", "Panes", footer=True),
    Key("f", "show('findings')", "findings", "Panes", footer=True),
    Key("r", "show('request')", "request lifeline and id search", "Panes", footer=True),
    Key("w", "show('worker')", "worker state (replays to the cursor)", "Panes", footer=True),
    Key("s", "show('sql')", "SQL prompt", "Panes", footer=True),
    Key("slash", "search", "search a request id (prefix)", "Requests", label="/"),
    Key("l", "follow", "lifeline of the request under the cursor", "Requests"),
    Key("z", "fold", "fold or unfold long lists", "Detail"),
    Key("escape", "cancel", "cancel a replay or a query", "Work", label="Esc"),
    Key("question_mark", "help", "this help", "App", footer=True, label="?"),
    Key("q", "quit", "quit", "App", footer=True),
)

# Keys that work inside a pane, listed on the help screen only (the pane binds them itself).
PANE_KEYS: tuple[tuple[str, str, str], ...] = (
    ("Enter", "findings: jump to the finding's step and request", "Findings"),
    ("Enter", "request search: show the chosen id's lifeline", "Requests"),
    ("Enter", "SQL prompt: run the query", "SQL"),
    ("Tab", "move focus between the list and the panes", "App"),
)


def bindings() -> list[Binding]:
    return [Binding(k.keys, k.action, k.description, show=k.footer) for k in KEYS]
