"""The worker's state after the selected step, from the replay Session: request cache, batch
order, block tables, encoder cache, and (a real worker) recorded against replayed tokens."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import ProgressBar, Static
from vllm_contract.findings import Finding
from vllm_contract.tui.detail import blocks, fold, plain


def render(state: dict, findings: list[Finding], divergences: list, worker: str,
           unfolded: bool) -> Group:
    reqs = state.get("requests", {})
    parts: list = [Text(f"{worker} worker at position {state.get('position')} "
                        f"(next step {state.get('next_step')})", style="bold"),
                   Text(f"batch order ({len(state.get('batch', []))}): "
                        f"{fold(state.get('batch', []), unfolded, 16)}")]
    table = Table(title=f"request cache ({len(reqs)})", title_justify="left", expand=True)
    for col in ("req_id", "prompt", "computed", "output", "introduced", "preempted",
                "block table"):
        table.add_column(col, overflow="fold")
    for rid, r in reqs.items():
        table.add_row(rid, str(r.get("prompt_len")), str(r.get("num_computed_tokens")),
                      str(r.get("num_output_tokens")), str(r.get("introduced_at")),
                      "yes" if r.get("preempted") else "", blocks(r.get("block_ids"), unfolded))
    parts.append(table)
    parts.append(Text(f"encoder cache ({len(state.get('encoder_cache', []))}): "
                      f"{fold(state.get('encoder_cache', []), unfolded)}"))
    holders = state.get("block_holders", {})
    shared = {b: h for b, h in holders.items() if len(h) > 1}
    parts.append(Text(f"blocks held: {len(holders)}, by more than one request: {len(shared)}"
                      + (f" ({fold([f'{b}:{h}' for b, h in shared.items()], unfolded)})"
                         if shared else "")))
    if worker == "shadow":
        parts.append(Text("tokens: the shadow worker replays no tokens (no divergences)",
                          style="dim"))
    else:
        parts.append(Text(f"divergences ({len(divergences)}): "
                          f"{fold(divergences, unfolded)}", style="red" if divergences else ""))
    parts.append(Text(f"worker findings so far ({len(findings)})"))
    for f in findings[-20:]:
        parts.append(Text(f"● step {f.step} {f.invariant} {f.req_id or ''}: {f.message}",
                          style="red" if f.severity == "error" else "yellow"))
    return Group(*parts)


class WorkerPane(VerticalScroll):
    DEFAULT_CSS = """
    WorkerPane { height: 1fr; }
    WorkerPane ProgressBar { display: none; }
    WorkerPane.replaying ProgressBar { display: block; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.renderable = Text("the worker replays when this pane is shown")
        self.state: dict | None = None
        self.error: str | None = None

    def compose(self):
        yield ProgressBar(id="worker-progress", show_eta=False)
        yield Static(self.renderable, id="worker-body")

    def progress(self, done: int, total: int) -> None:
        self.add_class("replaying")
        self.query_one(ProgressBar).update(total=max(total, 1), progress=done)

    def show(self, state: dict, findings: list[Finding], divergences: list, worker: str,
             unfolded: bool) -> None:
        self.remove_class("replaying")
        self.state, self.error = state, None
        self._set(render(state, findings, divergences, worker, unfolded))

    def fail(self, error: str) -> None:
        self.remove_class("replaying")
        self.error = error
        self._set(Text(f"worker unavailable: {error}", style="red"))

    def note(self, text: str) -> None:
        self.remove_class("replaying")
        self._set(Text(text, style="dim"))

    def _set(self, renderable) -> None:
        self.renderable = renderable
        self.query_one("#worker-body", Static).update(renderable)

    @property
    def text(self) -> str:
        return plain(self.renderable)
