"""The reading side's public face: open a trace, query and check it (`query/`, DuckDB), replay
it (`worker/`). What the TUI may import. Loaded lazily, so that `vllm_contract.replay.trace`
stays as light as the reader it names."""

from __future__ import annotations

from importlib import import_module

# name -> (module, attribute)
_EXPORTS = {"open_trace": ("vllm_contract.trace", "open_trace"),
            "Trace": ("vllm_contract.trace", "Trace"),
            "Gateway": ("vllm_contract.replay.query.gateway", "Gateway"),
            "Session": ("vllm_contract.replay.session", "Session"),
            # the worker kinds Session steps, by name (`--worker`), and their settings
            "worker_class": ("vllm_contract.replay.worker.registry", "worker_class"),
            "WorkerOptions": ("vllm_contract.replay.worker.base", "WorkerOptions"),
            # the invariant catalog (each check's title, why, the vLLM code relying on it) and
            # the checker that runs it on a Gateway
            "Invariant": ("vllm_contract.replay.query.catalog", "Invariant"),
            "load_catalog": ("vllm_contract.replay.query.catalog", "load"),
            "run_checks": ("vllm_contract.replay.query.checker", "run"),
            # re-run the scheduler on a trace (vLLM loaded when called)
            "resim": ("vllm_contract.replay.resim", "resim")}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(import_module(module), attr)
