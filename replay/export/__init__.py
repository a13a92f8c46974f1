"""One home for what the commands print: each kind of result (a check's findings, a query's
rows, a replay, a re-run or a reduction, a trace's summary, a written timeline, the live
engines) rendered in each of its formats, by the function registered for it (registry.py).
The command line reads its --format choices from here and prints what `render` returns. A new
kind's module is imported below, which registers it. Light to import: the command line's
start loads it, so nothing here imports DuckDB, pyarrow or vLLM."""

from __future__ import annotations

from vllm_contract.replay.export.registry import Rendered, exporter, formats, render

# importing them registers their formats
from vllm_contract.replay.export import (  # noqa: F401
    contract, engines, findings, replays, resims, summary, tables, timelines)

__all__ = ["Rendered", "exporter", "formats", "render"]
