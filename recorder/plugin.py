"""The `vllm.general_plugins` entry point: zero-config recording of live engines.

vLLM calls `register()` in every process it starts (front end, engine core, workers). Without
`VLLM_CONTRACT_TRACE_DIR` or `VLLM_CONTRACT_ARM` it returns after two environment lookups and
touches nothing. Otherwise it:

- hooks `EngineCore`'s scheduler assignment. vLLM's `EngineCore.__init__` calls the plugins first
  and then does `self.scheduler = Scheduler(...)` with whatever class the config names
  (`Scheduler`, `AsyncScheduler`, a `--scheduler-cls`); a set-only data descriptor on
  `EngineCore.scheduler` sees that assignment, for every engine core and subclass (data
  parallel included), with the executor already built. Reads of `engine.scheduler` stay plain
  instance-dict reads (the descriptor has no `__get__`). The engine is then armed (armed.py):
  a gate on its scheduler's schedule(), a counter on its executor's execute_model(), and the
  control socket (control.py) for `vllm-contract attach`;
- with `VLLM_CONTRACT_TRACE_DIR`, starts recording each engine into that root at once;
- notes each worker's receipt of a step (receipts.py), in worker processes and in-process;
- seals recordings when the engine shuts down, and at interpreter exit.

Nothing here may break an engine: every failure is one log line, and the engine runs unrecorded.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

from vllm_contract.recorder import settings as settings_mod

log = logging.getLogger("vllm_contract.recorder")

_settings: settings_mod.Settings | None = None
_server = None
_server_failed = False
_lock = threading.Lock()


def register() -> None:
    """Entry point. Unarmed: two dict lookups, nothing else."""
    if not settings_mod.wants_plugin():
        return
    try:
        _arm_process()
    except Exception as e:
        log.error("vllm-contract: plugin not loaded: %s: %s", type(e).__name__, e)


def _arm_process() -> None:
    global _settings
    with _lock:
        if _settings is not None:
            return
        try:
            s = settings_mod.from_env()
        except settings_mod.SettingsError as e:
            log.error("vllm-contract: not recording: %s", e)
            return
        _settings = s
    from vllm.v1.engine.core import EngineCore

    if not isinstance(EngineCore.__dict__.get("scheduler"), _SchedulerSlot):
        EngineCore.scheduler = _SchedulerSlot()
    from vllm_contract.recorder import receipts

    receipts.install_worker_hook()
    atexit.register(_at_exit)


class _SchedulerSlot:
    """`EngineCore.scheduler`, set-only: every `engine.scheduler = ...` arms that engine."""

    def __set__(self, engine: Any, scheduler: Any) -> None:
        engine.__dict__["scheduler"] = scheduler
        try:
            arm_engine(engine, scheduler)
        except Exception as e:
            log.error("vllm-contract: engine not armed: %s: %s", type(e).__name__, e)

    def __delete__(self, engine: Any) -> None:
        del engine.__dict__["scheduler"]


def arm_engine(engine: Any, scheduler: Any, settings: settings_mod.Settings | None = None,
               serve: bool = True):
    """Arm one engine core (the scheduler it just got, and its executor); with a trace dir in
    the settings, start recording at once; with serve, listen for `vllm-contract attach`.
    Returns the ArmedEngine. (The plugin calls this; so can a harness with engine=None.)"""
    from vllm_contract.recorder import receipts
    from vllm_contract.recorder.armed import ArmedEngine

    s = settings or _settings or settings_mod.Settings(arm=True)
    if engine is not None:
        receipts.install_worker_hook()  # an in-process worker reports its receipts too
    executor = getattr(engine, "model_executor", None) if engine is not None else None
    armed = ArmedEngine(scheduler, executor)
    if engine is not None:
        _hook_shutdown(engine, armed)
    if s.trace_dir:
        try:
            # During EngineCore.__init__: no step has run, so starting here is a step boundary.
            armed.start(s.trace_dir, started_by=settings_mod.TRACE_DIR, now=True,
                        **s.writer_options)
        except Exception as e:
            log.error("vllm-contract: not recording into %s: %s: %s", s.trace_dir,
                      type(e).__name__, e)
    if serve:
        ensure_server()
    return armed


def _hook_shutdown(engine: Any, armed: Any) -> None:
    """Seal the recording before the engine tears down (the writer is a daemon thread)."""
    original = engine.shutdown

    def shutdown(*args: Any, **kwargs: Any) -> Any:
        try:
            armed.shutdown()
        except Exception as e:
            log.error("vllm-contract: closing the trace failed: %s: %s", type(e).__name__, e)
        try:
            _close_server_after(armed)
        except Exception as e:
            log.error("vllm-contract: closing the control socket failed: %s: %s",
                      type(e).__name__, e)
        return original(*args, **kwargs)

    engine.shutdown = shutdown


def ensure_server():
    """The control socket of this process (one for all its engines), started once."""
    global _server, _server_failed
    with _lock:
        if _server is not None or _server_failed:
            return _server
        try:
            from vllm_contract.recorder.armed import armed_engines
            from vllm_contract.recorder.control import ControlServer

            _server = ControlServer(armed_engines)
        except Exception as e:
            _server_failed = True
            log.error("vllm-contract: attach disabled for this process: %s", e)
        return _server


def _close_server_after(armed: Any) -> None:
    """The engine of `armed` is shutting down: with no other engine armed in this process, the
    control socket goes now, before the executor's teardown. vLLM gives an engine core process
    a few seconds after SIGTERM before it kills it, and a killed process leaves its socket."""
    global _server
    from vllm_contract.recorder.armed import armed_engines

    armed.shut_down = True
    with _lock:
        if _server is not None and not [e for e in armed_engines()
                                         if not getattr(e, "shut_down", False)]:
            _server.close()
            _server = None  # an engine made later in this process serves a new one


def _at_exit() -> None:
    from vllm_contract.recorder.armed import armed_engines

    for e in armed_engines():
        try:
            e.shutdown(timeout=10.0)
        except Exception:
            pass
    if _server is not None:
        _server.close()
