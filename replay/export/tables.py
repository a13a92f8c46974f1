"""A query's result, an Arrow table, in every format of `sql --format`. Only the table's
`to_pylist` and `column_names` are used, so nothing here imports pyarrow."""

from __future__ import annotations

from vllm_contract.replay.export.registry import Rendered, exporter
from vllm_contract.replay.export.text import csv_text, json_doc

KIND = "rows"
WIDEST = 60  # a column's width in the table; longer values are cut


def _json_value(v):
    """A value JSON has no type for: DuckDB's sums are 128-bit integers (Arrow decimals of
    scale 0), which stay numbers; times and the like become their text."""
    import decimal

    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    return str(v)


@exporter(KIND, "table")
def table(t) -> Rendered:
    rows = t.to_pylist()
    cols = t.column_names
    cells = [[("NULL" if r[c] is None else str(r[c])) for c in cols] for r in rows]
    widths = [min(WIDEST, max([len(c)] + [len(row[i]) for row in cells]))
              for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v[:w].ljust(w) for v, w in zip(row, widths)) for row in cells]
    lines.append(f"({len(rows)} row{'s' * (len(rows) != 1)})")
    return Rendered().out("".join(line + "\n" for line in lines))


@exporter(KIND, "json")
def as_json(t) -> Rendered:
    return Rendered().out(json_doc(t.to_pylist(), default=_json_value))


@exporter(KIND, "csv")
def as_csv(t) -> Rendered:
    return Rendered().out(csv_text(t.to_pylist(), t.column_names))
