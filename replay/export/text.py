"""The plain-text building blocks every exporter shares: JSON documents, JSON lines, CSV."""

from __future__ import annotations

import csv
import io
import json


def json_doc(value, default=None) -> str:
    return json.dumps(value, indent=2, default=default) + "\n"


def json_lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def csv_text(rows: list[dict], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
