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
- seals recordings when the engine shuts down, and at interpreter exit; in the API server, gives
  engine cores time to do so (vLLM's default is to kill them at once), and in the engine core
  holds SIGTERM/SIGINT back while the trace is sealed;
- says in vLLM's log (logger `vllm.vllm_contract`) when an engine is armed, starts and stops
  recording, and shuts down; silences vLLM's "Unknown vLLM environment variable" warning for our
  own variables.

Nothing here may break an engine: every failure is one log line, and the engine runs unrecorded.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from typing import Any, Iterator

from vllm_contract.recorder import settings as settings_mod
from vllm_contract.recorder.engine_info import dp_rank

log = logging.getLogger("vllm.vllm_contract")  # under vLLM's logger: our lines join its log

_settings: settings_mod.Settings | None = None
_server = None
_server_failed = False
_lock = threading.Lock()


def register() -> None:
    """Entry point. Unarmed: two dict lookups, nothing else."""
    if not settings_mod.wants_plugin():
        return
    _check_main_guard()
    try:
        _arm_process()
    except Exception as e:
        log.error("vllm-contract: plugin not loaded: %s: %s", type(e).__name__, e)


def _check_main_guard() -> None:
    """vLLM builds an engine while multiprocessing's spawn imports the main script again: the
    script makes its engine at import time, with no `if __name__ == "__main__":`, and the engine
    core vLLM spawns is about to fail with multiprocessing's bootstrapping error. Say why, here
    and to `vllm-contract record`."""
    try:
        import multiprocessing.process

        if not getattr(multiprocessing.process.current_process(), "_inheriting", False):
            return
        log.error("vllm-contract: this process, spawned by vLLM, imports the main script again "
                  "and the script starts a vLLM engine as it is imported: put the script's code "
                  "under `if __name__ == \"__main__\":`")
        notes = os.environ.get(settings_mod.RECORD_NOTES)
        if notes:
            with open(notes, "a") as f:
                f.write("main-guard\n")
    except Exception:
        pass


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
    _quiet_env_warning()
    from vllm.v1.engine.core import EngineCore

    if not isinstance(EngineCore.__dict__.get("scheduler"), _SchedulerSlot):
        EngineCore.scheduler = _SchedulerSlot()
    _give_engine_cores_time()
    from vllm_contract.recorder import receipts

    receipts.install_worker_hook()
    atexit.register(_at_exit)


class _KnownEnvFilter(logging.Filter):
    """Drops vLLM's "Unknown vLLM environment variable detected: VLLM_CONTRACT_..." warning for
    our own variables (settings.KNOWN_ENV); the plugin's own lines say what they do."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not ("Unknown vLLM environment variable" in str(record.msg)
                        and any(str(a) in settings_mod.KNOWN_ENV for a in record.args or ()))
        except Exception:
            return True


def _quiet_env_warning() -> None:
    try:
        target = logging.getLogger("vllm.platforms.interface")  # where vLLM validates VLLM_*
        if not any(isinstance(f, _KnownEnvFilter) for f in target.filters):
            target.addFilter(_KnownEnvFilter())
    except Exception as e:
        log.error("vllm-contract: %s: %s", type(e).__name__, e)


# vLLM's API server stops its engine core processes with `--shutdown-timeout` (default 0): a
# SIGTERM and, that timeout later, a SIGKILL. With 0 the SIGKILL follows at once, before the
# engine core's shutdown runs, and every recording of it ends unsealed, its last unflushed steps
# lost. Armed, the process manager waits this long instead: vLLM's own grace when no timeout is
# given. An engine core that is done sooner is not waited for.
SHUTDOWN_GRACE_S = 5.0


def _give_engine_cores_time() -> None:
    try:
        from vllm.v1.engine.utils import CoreEngineProcManager

        original = CoreEngineProcManager.shutdown
        if getattr(original, "_vllm_contract", False):
            return

        def shutdown(self: Any, timeout: float | None = None, *args: Any, **kwargs: Any) -> Any:
            try:
                if timeout is not None and timeout < SHUTDOWN_GRACE_S:
                    log.info("vllm-contract: giving the engine core %g s to seal its trace "
                             "(instead of --shutdown-timeout's %g)", SHUTDOWN_GRACE_S, timeout)
                    timeout = SHUTDOWN_GRACE_S
            except Exception:
                pass
            return original(self, timeout, *args, **kwargs)

        shutdown._vllm_contract = True
        CoreEngineProcManager.shutdown = shutdown
    except Exception as e:  # another vLLM: its shutdown as it is
        log.warning("vllm-contract: engine cores keep vLLM's shutdown timeout: %s: %s",
                    type(e).__name__, e)


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
    server = ensure_server() if serve else None
    if engine is not None:
        _say_armed(armed, server, s)
    return armed


def _describe(armed: Any) -> str:
    return f"pid {os.getpid()}, dp rank {dp_rank(armed.scheduler)}"


def _say_armed(armed: Any, server: Any, s: settings_mod.Settings) -> None:
    """One line per engine in vLLM's log: armed, and how to record it."""
    try:
        how = settings_mod.TRACE_DIR if s.trace_dir else f"{settings_mod.ARM}=1"
        if server is None:
            log.info("vllm-contract: engine armed (%s; %s); attach is disabled for it",
                     _describe(armed), how)
        elif armed.recorder is None:
            log.info("vllm-contract: engine armed, not recording (%s; %s): "
                     "`vllm-contract attach %d --out DIR` records it", _describe(armed), how,
                     os.getpid())
        else:
            log.info("vllm-contract: engine armed (%s; %s): `vllm-contract detach %d` stops "
                     "its recording", _describe(armed), how, os.getpid())
    except Exception:
        pass


def _hook_shutdown(engine: Any, armed: Any) -> None:
    """Seal the recording before the engine tears down (the writer is a daemon thread)."""
    original = engine.shutdown

    def shutdown(*args: Any, **kwargs: Any) -> Any:
        with _signals_deferred():
            try:
                armed.shutdown()
            except Exception as e:
                log.error("vllm-contract: closing the trace failed: %s: %s", type(e).__name__, e)
            try:
                _close_server_after(armed)
            except Exception as e:
                log.error("vllm-contract: closing the control socket failed: %s: %s",
                          type(e).__name__, e)
            try:
                log.info("vllm-contract: engine shut down (%s): no longer armed",
                         _describe(armed))
            except Exception:
                pass
        return original(*args, **kwargs)

    engine.shutdown = shutdown


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT wait while the trace is sealed, then take their course as they would
    have. On Ctrl-C, vLLM's engine core process gets SIGINT, restores the default handlers and
    shuts down; its API server's process manager sends it a SIGTERM at the same time, which
    would kill it before the trace is sealed. Only the main thread can do this; elsewhere
    nothing is deferred."""
    caught: list[int] = []
    previous: dict[int, Any] = {}
    try:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                handler = signal.getsignal(sig)
                if handler is not None:  # None: a handler not set from Python, not ours to undo
                    signal.signal(sig, lambda s, _f: caught.append(s))
                    previous[sig] = handler
    except Exception:
        pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            try:
                signal.signal(sig, handler)
            except Exception:
                pass
        if caught:
            os.kill(os.getpid(), caught[0])


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
