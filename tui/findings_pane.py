"""The findings: the catalog's and the worker's, each with its invariant's title, why it
matters and the vLLM code that relies on it. Enter jumps to its step and request."""

from __future__ import annotations

from rich.text import Text
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static
from vllm_contract.findings import Finding


class FindingsPane(Vertical):
    DEFAULT_CSS = """
    FindingsPane DataTable { height: 1fr; }
    FindingsPane #why { height: auto; max-height: 12; border-top: solid $primary; }
    """

    class Jump(Message):
        def __init__(self, finding: Finding) -> None:
            super().__init__()
            self.finding = finding

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.findings: list[Finding] = []
        self.explanations: dict = {}

    def compose(self):
        table = DataTable(cursor_type="row", id="findings-table", zebra_stripes=True)
        table.add_columns("step", "severity", "invariant", "req_id", "message")
        yield table
        yield Static("checking the trace…", id="why")

    def load(self, findings: list[Finding], explanations: dict) -> None:
        self.findings, self.explanations = findings, explanations
        table = self.query_one(DataTable)
        table.clear()
        for i, f in enumerate(findings):
            table.add_row("-" if f.step is None else str(f.step), f.severity, f.invariant,
                          f.req_id or "", f.details[:200], key=str(i))
        if not findings:
            self.query_one("#why", Static).update("no findings")
        else:
            self.explain(0)

    def explain(self, i: int) -> None:
        f = self.findings[i]
        e = self.explanations.get(f.invariant)
        text = Text()
        text.append(f"{f.invariant}", style="bold")
        text.append(f" ({f.severity})  {e.title if e else f.title}\n")
        text.append("why it matters: ", style="bold")
        text.append((e.why if e else "a finding of the worker replay (no catalog entry)") + "\n")
        text.append("relied on by: ", style="bold")
        text.append((e.relies_on if e else "vllm/v1/worker/gpu_model_runner.py "
                     "GPUModelRunner._update_states") + "\n")
        text.append(f.message)
        self.query_one("#why", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None and self.findings:
            self.explain(int(event.row_key.value))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(self.Jump(self.findings[int(event.row_key.value)]))
