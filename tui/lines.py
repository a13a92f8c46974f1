"""A scrolling pane of prepared lines, drawn with Textual's line API: only the visible lines are
turned into strips, and nothing is measured. The detail and worker panes were Rich tables in a
Static: each new step re-measured every cell of the table on the event loop, which held the
steps list's cursor back (bench/RESULTS.md)."""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

Span = tuple[str, str]  # (text, Rich style definition; "" for none)
Line = str | list[Span]

BOLD, DIM, RED, YELLOW = "bold", "dim", "red", "yellow"


class Lines(ScrollView, can_focus=True):
    DEFAULT_CSS = "Lines { height: 1fr; }"

    def __init__(self, text: str = "", **kw) -> None:
        super().__init__(**kw)
        self.lines: list[Line] = []
        self._strips: dict[int, Strip] = {}
        self._styles: dict[str, Style] = {}
        self.set_lines([text] if text else [])

    def set_lines(self, lines: list[Line]) -> None:
        self.lines = lines
        self._strips.clear()
        width = max((self._width(ln) for ln in lines), default=0)
        self.virtual_size = Size(width, len(lines))
        self.refresh()

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

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if index >= len(self.lines):
            return Strip.blank(width, self.rich_style)
        return self._strip(index).crop_extend(scroll_x, scroll_x + width,
                                              self.rich_style).apply_style(self.rich_style)

    @property
    def text(self) -> str:
        """The lines as plain text (what a person reads, for tests and copying)."""
        return "\n".join(ln if isinstance(ln, str) else "".join(t for t, _ in ln)
                         for ln in self.lines)
