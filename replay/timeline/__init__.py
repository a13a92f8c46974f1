"""Timelines of a trace (docs/timeline.md): what to draw (spans.py) and the Perfetto file
(perfetto.py)."""
