"""The steps list: one line per recorded step, rendered only where visible (the line API), from
pages of rows the app fetches on a worker thread and this widget keeps in a bounded cache."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from vllm_contract.tui.data import PAGE

MAX_PAGES = 64  # a bound on memory however long the session: 64 x 128 rows
HEADER = (f"  {'step':>9} {'time s':>9} {'new':>4}{'cach':>5}{'res':>4} {'tokens':>6} "
          f"{'fin':>4}{'pre':>4} {'run':>4}{'wait':>5} {'kv':>4}")
MARK = Style(color="red", bold=True)
CURSOR = Style(reverse=True)


def format_row(row: dict, t0: int) -> str:
    t = (row["t_ns"] - t0) / 1e9 if row.get("t_ns") is not None else float("nan")
    kv = row.get("kv_usage")

    def n(v) -> str:
        return "-" if v is None else str(v)

    return (f"{row['step']:>9} {t:>9.3f} {n(row['new']):>4}{n(row['cached']):>5}"
            f"{n(row['resumed']):>4} {n(row['tokens']):>6} {n(row['finished']):>4}"
            f"{n(row['preempted']):>4} {n(row['running']):>4}{n(row['waiting']):>5} "
            f"{'-' if kv is None else format(kv, '>4.0%')}")


class StepList(ScrollView, can_focus=True, inherit_bindings=False):
    DEFAULT_CSS = "StepList { height: 1fr; }"

    cursor: reactive[int] = reactive(0, always_update=False)

    class Moved(Message):
        def __init__(self, index: int, step: int) -> None:
            super().__init__()
            self.index, self.step = index, step

    class NeedPages(Message):
        """The pages (by first row) the list wants and does not hold, the most needed first."""
        def __init__(self, starts: list[int]) -> None:
            super().__init__()
            self.starts = starts

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.steps = np.zeros(0, dtype=np.int64)
        self.t0 = 0
        self.pages: OrderedDict[int, list[dict]] = OrderedDict()
        self.asked: list[int] = []  # what the last NeedPages asked for and has not come
        self.hints: tuple[int, ...] = ()  # rows the cursor may jump to next (findings)
        self.marked: set[int] = set()

    # -- data ---------------------------------------------------------------------------------
    def set_steps(self, steps: np.ndarray, t0: int) -> None:
        self.steps, self.t0 = steps, t0
        self.pages.clear()
        self.asked = []
        self.virtual_size = Size(len(HEADER) + 2, len(steps))
        self.refresh()
        self._ask_visible()

    def add_page(self, start: int, rows: list[dict]) -> None:
        if start in self.asked:
            self.asked.remove(start)
        self.pages[start] = rows
        self.pages.move_to_end(start)
        while len(self.pages) > MAX_PAGES:
            self.pages.popitem(last=False)
        self.refresh()

    def mark(self, steps: set[int]) -> None:
        self.marked = steps
        self.refresh()

    def row(self, index: int) -> dict | None:
        start = index - index % PAGE
        page = self.pages.get(start)
        if page is None:
            return None
        self.pages.move_to_end(start)
        k = index - start
        return page[k] if k < len(page) else None

    @property
    def step(self) -> int | None:
        return int(self.steps[self.cursor]) if len(self.steps) else None

    def prefetch(self, *rows: int) -> None:
        """Rows the cursor may jump to next: their pages are fetched ahead, after those shown."""
        self.hints = rows
        self._ask_visible()

    def _ask_visible(self) -> None:
        """Ask for the pages shown, then one page either side of them, then the hints'."""
        n = len(self.steps)
        if not n:
            return
        top = int(self.scroll_offset.y)
        bottom = min(n - 1, top + max(self.size.height, 1))
        rows = [self.cursor, top, bottom, bottom + PAGE, top - PAGE, *self.hints]
        want = list(dict.fromkeys(r - r % PAGE for r in rows if 0 <= r < n))
        want = [w for w in want if w not in self.pages][:MAX_PAGES // 2]
        # a new ask supersedes the last (the app's page worker is exclusive): made only when
        # the running one does not cover what is wanted now
        if any(w not in self.asked for w in want):
            self.asked = want
            self.post_message(self.NeedPages(want))

    # -- moving -------------------------------------------------------------------------------
    def go(self, index: int) -> None:
        if not len(self.steps):
            return
        self.cursor = max(0, min(int(index), len(self.steps) - 1))

    def watch_cursor(self, old: int, new: int) -> None:
        height = max(self.size.height, 1)
        y = int(self.scroll_offset.y)
        if new < y:
            self.scroll_to(y=new, animate=False, immediate=True)
        elif new >= y + height:
            self.scroll_to(y=new - height + 1, animate=False, immediate=True)
        self.refresh()
        self._ask_visible()
        if len(self.steps):
            self.post_message(self.Moved(new, int(self.steps[new])))

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self._ask_visible()

    def on_resize(self, event: events.Resize) -> None:
        self._ask_visible()

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None:
            self.go(int(self.scroll_offset.y) + offset.y)

    # -- drawing ------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        index = int(self.scroll_offset.y) + y
        width = self.size.width
        if index >= len(self.steps):
            return Strip.blank(width)
        row = self.row(index)
        step = int(self.steps[index])
        text = format_row(row, self.t0) if row else f"{step:>9}  …"
        style = CURSOR if index == self.cursor else Style()
        mark = Segment("● " if step in self.marked else "  ", MARK + style)
        return Strip([mark, Segment(text.ljust(max(0, width - 2)), style)]).crop(0, width)
