"""The reading side's public face: open a trace, query and check it (`query/`, DuckDB), replay
it (`worker/`). What the TUI may import. Loaded lazily, so that `vllm_contract.replay.trace`
stays as light as the reader it names."""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {"open_trace": "vllm_contract.trace", "Trace": "vllm_contract.trace",
            "Gateway": "vllm_contract.replay.query.gateway",
            "Session": "vllm_contract.replay.session"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
