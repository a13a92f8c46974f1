"""One home for what the commands print: each kind of result (a check's findings, a query's
rows, a replay, a trace's summary, the live engines) rendered in each of its formats, by the
function registered for it (registry.py). The command line reads its --format choices from
here and prints what `render` returns. Light to import: the command line's start loads it, so
nothing here imports DuckDB, pyarrow or vLLM."""

from __future__ import annotations

from vllm_contract.replay.export.registry import Rendered, exporter, formats, render

# importing them registers their formats
from vllm_contract.replay.export import (  # noqa: F401
    contract, engines, findings, replays, summary, tables)

__all__ = ["Rendered", "exporter", "formats", "render"]
