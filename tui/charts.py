"""Small charts of the whole trace, one line each, with the cursor's step marked."""

from __future__ import annotations

from rich.text import Text
from textual.containers import Vertical
from textual.widget import Widget

BARS = " ▁▂▃▄▅▆▇█"
CHARTS = (("tokens", "tokens/step"), ("batch", "batch size"), ("kv", "KV usage"),
          ("running", "running"), ("waiting", "waiting"))


def resample(values: list[float], width: int) -> list[float]:
    """The largest value of each of `width` slices (a peak stays visible when squeezed)."""
    if width <= 0 or not values:
        return []
    n = len(values)
    return [max(values[i * n // width:max(i * n // width + 1, (i + 1) * n // width)])
            for i in range(width)]


class Spark(Widget):
    DEFAULT_CSS = "Spark { height: 1; }"

    def __init__(self, key: str, label: str, **kw) -> None:
        super().__init__(**kw)
        self.key, self.label = key, label
        self.values: list[float] = []
        self.at: float | None = None  # the cursor, as a fraction of the trace's steps

    def _column(self, at: float | None) -> int | None:
        width = max(0, self.size.width - len(f"{self.label:>12} ") - 8)  # as render() draws
        return None if at is None else int(at * width)

    def point(self, at: float) -> None:
        # a step on a long trace seldom moves the mark by a column: drawn again only if it does
        if self._column(at) != self._column(self.at) or not self.size.width:
            self.refresh()
        self.at = at

    def render(self) -> Text:
        label = f"{self.label:>12} "
        width = max(0, self.size.width - len(label) - 8)
        vals = resample(self.values, width)
        top = max(vals, default=0) or 1
        text = Text(label, style="bold")
        cursor = None if self.at is None or not vals else min(len(vals) - 1,
                                                              int(self.at * len(vals)))
        for i, v in enumerate(vals):
            ch = BARS[round(v / top * (len(BARS) - 1))]
            text.append(ch if i != cursor else "┃", style="bold red" if i == cursor else "cyan")
        text.append(f" {top:.2f}" if self.key == "kv" else f" {top:.0f}", style="dim")
        return text


class Charts(Vertical):
    DEFAULT_CSS = "Charts { height: auto; border-top: solid $primary; }"

    def compose(self):
        for key, label in CHARTS:
            yield Spark(key, label, id=f"chart-{key}")

    def load(self, series: dict[str, list[float]]) -> None:
        self.range = series.get("_range", [0.0, 0.0])
        for spark in self.query(Spark):
            spark.values = series.get(spark.key, [])
            spark.refresh()

    def point(self, step: int) -> None:
        lo, hi = getattr(self, "range", (0.0, 0.0))
        at = 0.0 if hi <= lo else (step - lo) / (hi - lo + 1)
        for spark in self.query(Spark):
            spark.point(at)
