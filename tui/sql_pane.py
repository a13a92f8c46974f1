"""A SQL prompt over the trace's views (those of `vllm-contract sql`), results in a table.

The table is textual-fastdatatable's: it draws from the Arrow result itself, only the rows in
view, so a result of a million rows is shown whole, where Textual's own DataTable took a Python
row per line (and was capped at a thousand)."""

from __future__ import annotations

import pyarrow as pa
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Static
from textual_fastdatatable import DataTable


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
        yield self._grid(None)

    @staticmethod
    def _grid(table: pa.Table | None) -> DataTable:
        # no markup: a value's brackets are text, not styles
        return DataTable(data=table, id="sql-result", zebra_stripes=True, null_rep="NULL",
                         render_markup=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.status("running…")
            self.post_message(self.Run(event.value.strip().rstrip(";")))

    def status(self, text: str) -> None:
        self.query_one("#sql-status", Static).update(text)

    async def show(self, table: pa.Table, seconds: float) -> None:
        # a fastdatatable takes its data once: a new result is a new table
        await self.query_one(DataTable).remove()
        await self.mount(self._grid(table))
        self.status(f"{table.num_rows} row{'s' * (table.num_rows != 1)} in {seconds:.2f} s")
