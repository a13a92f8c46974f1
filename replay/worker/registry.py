"""The worker kinds, by the name `--worker` takes: the one place a new kind is named. Each entry
is `module:Class`, imported when that kind is used, so the command line lists the names without
loading any worker (a vLLM one would load torch)."""

from __future__ import annotations

from importlib import import_module

from vllm_contract.errors import TraceError

WORKERS = {
    "shadow": "vllm_contract.replay.worker.shadow_worker:ShadowWorker",
    "vllm": "vllm_contract.replay.worker.vllm_worker:VllmWorker",
}


def names() -> list[str]:
    return list(WORKERS)


def worker_class(name: str):
    """The Worker subclass registered as `name`; TraceError for a name not registered."""
    if name not in WORKERS:
        raise TraceError(f"unknown worker {name!r}: "
                         + " or ".join(repr(n) for n in WORKERS))
    module, cls = WORKERS[name].split(":")
    return getattr(import_module(module), cls)
