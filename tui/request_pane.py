"""One request: search an id by prefix, then its lifeline across the trace (introduced,
chunks, preempted, resumed, finished, freed). Enter on an event jumps to its step."""

from __future__ import annotations

from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option
from vllm_contract.tui.data import Lifeline


class RequestPane(Vertical):
    DEFAULT_CSS = """
    RequestPane #matches { height: auto; max-height: 8; }
    RequestPane #lifeline { height: 1fr; }
    """

    class Search(Message):
        def __init__(self, prefix: str) -> None:
            super().__init__()
            self.prefix = prefix

    class Follow(Message):
        def __init__(self, req_id: str) -> None:
            super().__init__()
            self.req_id = req_id

    class JumpTo(Message):
        def __init__(self, step: int, req_id: str) -> None:
            super().__init__()
            self.step, self.req_id = step, req_id

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.lifeline: Lifeline | None = None
        self.matches: list[tuple[str, int]] = []

    def compose(self):
        yield Input(placeholder="request id or its prefix", id="search")
        yield OptionList(id="matches")
        yield Static("", id="life-title")
        yield OptionList(id="lifeline")

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "search" and event.value:
            self.post_message(self.Search(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if self.matches:
            self.post_message(self.Follow(self.matches[0][0]))

    def show_matches(self, prefix: str, ids: list[tuple[str, int]]) -> None:
        if prefix != self.query_one("#search", Input).value:
            return  # a newer prefix is on its way
        self.matches = ids
        box = self.query_one("#matches", OptionList)
        box.clear_options()
        box.add_options([Option(f"{rid}  (introduced at step {step})", id=rid)
                         for rid, step in ids] or [Option("no request id starts so",
                                                          disabled=True)])

    def show_lifeline(self, life: Lifeline) -> None:
        self.lifeline = life
        self.query_one("#life-title", Static).update(
            f"lifeline of {life.req_id}: {len(life.events)} event(s)")
        box = self.query_one("#lifeline", OptionList)
        box.clear_options()
        box.add_options([Option(line(e), id=str(i)) for i, e in enumerate(life.events)])

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option_list.id == "matches" and event.option.id:
            self.post_message(self.Follow(event.option.id))
        elif event.option_list.id == "lifeline" and self.lifeline:
            e = self.lifeline.events[int(event.option.id)]
            self.post_message(self.JumpTo(e.first, self.lifeline.req_id))


def line(e) -> str:
    where = f"step {e.first}" if e.first == e.last else f"steps {e.first}–{e.last}"
    what = e.event if e.count == 1 else f"{e.event} ×{e.count}"
    tokens = "" if e.tokens is None else (f", prompt {e.tokens} tokens" if e.event == "introduced"
                                          else f", {e.tokens} tokens")
    return f"{where:>22}  {what}{tokens}{'  ' + e.info if e.info else ''}"
