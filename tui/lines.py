"""A scrolling pane of prepared lines, drawn with Textual's line API: only the visible lines are
turned into strips, and nothing is measured. The detail and worker panes were Rich tables in a
Static: each new step re-measured every cell of the table on the event loop, which held the
steps list's cursor back (bench/RESULTS.md)."""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

Span = tuple[str, str]  # (text, Rich style definition; "" for none)
Line = str | list[Span]

BOLD, DIM, RED, YELLOW = "bold", "dim", "red", "yellow"


class Lines(ScrollView, can_focus=True):
    # Scrollbars always there: one appearing or going as a new step's lines grow past the pane
    # lays the whole screen out again, on the event loop the cursor waits for.
    DEFAULT_CSS = "Lines { height: 1fr; overflow: scroll scroll; }"

    def __init__(self, text: str = "", **kw) -> None:
        super().__init__(**kw)
        self.lines: list[Line] = []
        self._strips: dict[int, Strip] = {}
        self._styles: dict[str, Style] = {}
        self._base = Style()  # the widget's own style, read once per render
        self.set_lines([text] if text else [])

    def set_lines(self, lines: list[Line]) -> None:
        self.lines = lines
        self._strips.clear()
        width = max((self._width(ln) for ln in lines), default=0)
        self._resize(Size(width, len(lines)))
        self.refresh()

    def _resize(self, size: Size) -> None:
        """The new virtual size, without laying out the screen again: `virtual_size` is a
        layout reactive, and a layout of the whole app on every step held the cursor back
        (bench/RESULTS.md). The scrollbars are always shown, so none appears or goes."""
        if size == self.virtual_size:
            return
        if not self.is_mounted or not self.size:
            self.virtual_size = size  # the first layout is still to come
            return
        self.set_reactive(Lines.virtual_size, size)
        self._scroll_update(size)

    @staticmethod
    def _width(line: Line) -> int:
        return cell_len(line) if isinstance(line, str) else sum(cell_len(t) for t, _ in line)

    def _style(self, spec: str) -> Style:
        style = self._styles.get(spec)
        if style is None:
            style = self._styles[spec] = Style.parse(spec) if spec else Style()
        return style

    def _strip(self, index: int) -> Strip:
        strip = self._strips.get(index)
        if strip is None:
            line = self.lines[index]
            segs = ([Segment(line)] if isinstance(line, str)
                    else [Segment(t, self._style(s)) for t, s in line])
            strip = self._strips[index] = Strip(segs)
        return strip

    def render_lines(self, crop: Region) -> list[Strip]:
        self._base = self.rich_style  # computed from the CSS at each access: once, not per line
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        style = self._base
        if index >= len(self.lines):
            return Strip.blank(width, style)
        return self._strip(index).crop_extend(scroll_x, scroll_x + width,
                                              style).apply_style(style)

    @property
    def text(self) -> str:
        """The lines as plain text (what a person reads, for tests and copying)."""
        return "\n".join(ln if isinstance(ln, str) else "".join(t for t, _ in ln)
                         for ln in self.lines)
