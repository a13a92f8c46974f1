"""A SQL prompt over the trace's views (those of `vllm-contract sql`), results in a table."""

from __future__ import annotations

import pyarrow as pa
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Static

SHOWN = 1000  # rows put in the table; the count says how many there were


class SqlPane(Vertical):
    DEFAULT_CSS = """
    SqlPane DataTable { height: 1fr; }
    SqlPane #sql-status { height: auto; }
    """

    class Run(Message):
        def __init__(self, query: str) -> None:
            super().__init__()
            self.query = query

    def __init__(self, views: list[str], **kw) -> None:
        super().__init__(**kw)
        self.views = views

    def compose(self):
        yield Input(placeholder="SELECT … FROM steps | scheduled | lifeline | …  (Enter runs, "
                                "Esc cancels)", id="sql-input")
        yield Static("views: " + ", ".join(self.views), id="sql-status")
        yield DataTable(id="sql-result", zebra_stripes=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.status("running…")
            self.post_message(self.Run(event.value.strip().rstrip(";")))

    def status(self, text: str) -> None:
        self.query_one("#sql-status", Static).update(text)

    def show(self, table: pa.Table, seconds: float) -> None:
        grid = self.query_one(DataTable)
        grid.clear(columns=True)
        grid.add_columns(*table.column_names)
        for row in table.slice(0, SHOWN).to_pylist():
            grid.add_row(*("NULL" if v is None else str(v)[:200] for v in row.values()))
        more = f", showing {SHOWN}" if table.num_rows > SHOWN else ""
        self.status(f"{table.num_rows} row{'s' * (table.num_rows != 1)}{more} "
                    f"in {seconds:.2f} s")
