"""An armed engine: the plugin's hooks on one live engine core, and the recordings it runs.

Arming puts two thin wrappers on the engine, as instance attributes:

- the scheduler's `schedule()` gets a gate. Not recording, a step costs one flag check
  (`self.pending`). When something is due (a recording to start or stop, a limit to check), the
  engine thread applies it right there, at the step boundary, before the scheduler runs: a trace
  starts with a whole step and ends after a whole step.
- the executor's `execute_model()` counts hand-offs (one integer increment) and, when recording,
  notes that this step's SchedulerOutput was handed over (`transport` table).

Everything slow (directories, manifest, the writer thread, waiting for the writer to finish)
happens on the caller's thread (the control socket's, or vLLM's init), never on the engine's.
A recorder failure closes that recording at the next boundary; the engine goes on unrecorded.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from vllm_contract import schema
from vllm_contract.recorder.attach import Recorder
from vllm_contract.recorder.engine_info import dp_rank, model_on_cpu

log = logging.getLogger("vllm.vllm_contract")  # under vLLM's logger: our lines join its log

_registry: list[weakref.ref] = []
_registry_lock = threading.Lock()


def _say(msg: str, *args: Any) -> None:
    """One INFO line in vLLM's log; a logging problem is never the engine's."""
    try:
        log.info(msg, *args, stacklevel=2)  # vLLM's line names our caller, not this function
    except Exception:
        pass


def _name(rec: Recorder) -> str:
    return schema.engine_name(Path(rec.path))


def _root(rec: Recorder) -> str:
    return str(Path(rec.path).parent.parent)  # TRACE/_engines/engine=NAME


class RecordingError(Exception):
    """A start/stop request that cannot be honoured; the message says why."""


def armed_engines() -> list["ArmedEngine"]:
    with _registry_lock:
        alive = [r() for r in _registry]
        _registry[:] = [r for r, e in zip(_registry, alive) if e is not None and not e.disarmed]
        return [e for e in alive if e is not None and not e.disarmed]


class ArmedEngine:
    HISTORY = 16

    def __init__(self, scheduler: Any, executor: Any = None) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.recorder: Recorder | None = None
        self.pending = False  # the one flag the gate checks per step
        self.seq = 0  # execute_model() calls since arming
        self.disarmed = False
        self.armed_at = time.time()
        self.history: list[dict] = []  # finished recordings, newest last
        self._lock = threading.Lock()
        self._start: Recorder | None = None  # waiting for the next step boundary
        self._stop: str | None = None  # reason
        self._limits: dict[int, tuple] = {}  # id(recorder) -> (max_steps, deadline)
        self.receipts = None
        self.index = 0
        # An engine running its model on the CPU: the writer thread. There the recorder's total
        # CPU is what the model loses, and the writer process's pickle round trip adds to it
        # (bench/RESULTS.md); elsewhere the process, which keeps the work off the engine thread.
        self.default_writer = ("thread" if executor is not None and model_on_cpu(scheduler)
                               else "auto")
        if executor is not None:
            try:
                from vllm_contract.recorder.receipts import for_executor

                self.receipts = for_executor(executor)
            except Exception as e:
                log.error("vllm-contract: no worker receipts: %s: %s", type(e).__name__, e)
        self._install()
        with _registry_lock:
            self.index = len(_registry)
            _registry.append(weakref.ref(self))

    # -- the hooks ------------------------------------------------------------------------------
    def _install(self) -> None:
        sched = self.scheduler
        self._sched_shadowed = sched.__dict__.get("schedule")
        original = sched.schedule

        def schedule(*args: Any, **kwargs: Any) -> Any:
            if self.pending:
                return self._boundary(original, args, kwargs)
            return original(*args, **kwargs)

        schedule._vllm_contract_gate = self
        sched.schedule = schedule
        self._exec_shadowed = None
        if self.executor is not None:
            ex = self.executor
            self._exec_shadowed = ex.__dict__.get("execute_model")
            ex_original = ex.execute_model

            def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
                self.seq += 1
                rec = self.recorder
                if rec is not None:
                    rec.note_executed(scheduler_output, self.seq)
                return ex_original(scheduler_output, *args, **kwargs)

            ex.execute_model = execute_model

    def _boundary(self, original: Any, args: tuple, kwargs: dict) -> Any:
        """The slow path of the gate: apply what is due, then schedule (recorded or not)."""
        try:
            rec = self.recorder
            if (self._start is not None or self._stop is not None
                    or (rec is not None and self._due(rec))):
                with self._lock:
                    self._apply()
        except Exception as e:  # never the engine's problem
            log.error("vllm-contract: recording control failed: %s: %s", type(e).__name__, e)
            self._drop_recorder(f"control error: {type(e).__name__}: {e}")
        rec = self.recorder
        if rec is None:
            return original(*args, **kwargs)
        return rec.record_schedule(original, args, kwargs)

    def _due(self, rec: Recorder) -> bool:
        if rec.failed:
            return True
        limits = self._limits.get(id(rec))
        if limits is None:
            return False
        max_steps, deadline = limits
        return ((max_steps is not None and rec.step >= max_steps)
                or (deadline is not None and time.monotonic() >= deadline))

    def _apply(self) -> None:
        """Under the lock, at a step boundary (or with the engine idle): stop, then start."""
        rec = self.recorder
        if rec is not None:
            reason = self._stop
            if reason is None and rec.failed:
                reason = "recorder error"
            if reason is None and self._due(rec):
                max_steps, deadline = self._limits[id(rec)]
                reason = ("step limit" if max_steps is not None and rec.step >= max_steps
                          else "time limit")
            if reason is not None:
                self._finish(rec, reason)
        self._stop = None
        if self._start is not None and self.recorder is None:
            rec, self._start = self._start, None
            rec.install()
            self.recorder = rec
            _say("vllm-contract: recording engine %s (pid %d) into %s (%s)", _name(rec),
                 os.getpid(), _root(rec), rec.started_by)
        self.pending = self.recorder is not None or self._start is not None

    def _finish(self, rec: Recorder, reason: str) -> None:
        """Take the recorder off (cheap); its writer finishes on its own thread."""
        self.recorder = None
        self._limits.pop(id(rec), None)
        rec.close(wait=False)
        self.history.append({"path": str(rec.path), "steps": rec.step, "reason": reason,
                             "ended_at": time.time(), "_recorder": rec})
        del self.history[:-self.HISTORY]
        self.pending = self._start is not None
        _say("vllm-contract: stopped recording engine %s into %s after %d steps (%s)",
             _name(rec), _root(rec), rec.step, reason)

    def _drop_recorder(self, reason: str) -> None:
        try:
            with self._lock:
                rec = self.recorder
                if rec is not None:
                    self._finish(rec, reason)
                self._start = None
                self._stop = None
                self.pending = False
        except Exception:
            self.recorder = None
            self.pending = False

    # -- control (any thread but the engine's) -----------------------------------------------
    def start(self, trace_dir: str, *, started_by: str, max_steps: int | None = None,
              max_seconds: float | None = None, now: bool = False,
              **writer_options: Any) -> Recorder:
        """Prepare a recording and have the engine thread start it at its next step boundary
        (now=True: start it here; only safe before the engine steps, e.g. during its init)."""
        with self._lock:
            self._check_free()
        manifest_extra = {"transport": self.transport_info()}
        if max_steps is not None or max_seconds is not None:
            manifest_extra["limits"] = {"steps": max_steps, "seconds": max_seconds}
        rec = Recorder(self.scheduler, trace_dir, install=False, wrap_schedule=False,
                       started_by=started_by, receipts=self.receipts,
                       manifest_extra=manifest_extra, default_writer=self.default_writer,
                       **writer_options)
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        with self._lock:
            try:
                self._check_free()
            except RecordingError:
                rec.close()
                raise
            self._limits[id(rec)] = (max_steps, deadline)
            self._start = rec
            self.pending = True
            if now:
                self._apply()
        return rec

    def _check_free(self) -> None:
        busy = self.recorder or self._start
        if busy is not None:
            raise RecordingError(f"already recording into {busy.path}; detach first")

    def stop(self, reason: str = "detach", timeout: float = 10.0,
             close_timeout: float = 30.0) -> dict:
        """Stop at the next step boundary and wait for the trace to be closed. An idle engine
        (nothing scheduled, nothing to deliver) has no next boundary soon: then the recording
        is closed from here, which is safe because no step is running."""
        with self._lock:
            rec = self.recorder
            if rec is None and self._start is not None:  # never started: no step recorded
                rec, self._start = self._start, None
                self.recorder = rec
                self._finish(rec, reason)
                return self._closed_result(rec, close_timeout)
            if rec is None:
                raise RecordingError("not recording")
            self._stop = reason
            self.pending = True
        end = time.monotonic() + timeout
        while self.recorder is rec:
            if not self._busy() or time.monotonic() >= end:
                with self._lock:
                    if self.recorder is rec:
                        forced = self._busy()
                        self._apply()  # applies the queued stop
                        if forced:
                            self.history[-1]["reason"] += (
                                f" (forced: no step boundary within {timeout:g} s)")
                break
            time.sleep(0.005)
        return self._closed_result(rec, close_timeout)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until what the running recording has taken so far is on disk (True when not
        recording)."""
        rec = self.recorder
        return True if rec is None else rec.flush(timeout)

    def _closed_result(self, rec: Recorder, timeout: float) -> dict:
        done = rec.writer.wait_closed(timeout)
        m = rec.writer.manifest
        return {"path": str(rec.path), "steps": m["steps_recorded"], "closed": done,
                "closed_cleanly": bool(m.get("closed_cleanly")),
                "dropped_steps_total": m.get("dropped_steps_total", 0),
                "errors": [e["error"] for e in m["recorder_errors"]]}

    def _busy(self) -> bool:
        try:
            return bool(self.scheduler.has_requests())
        except Exception:
            return True

    def tick(self) -> None:
        """From the control thread, a few times a second: a time limit that runs out while the
        engine is idle (no boundary will come) ends the recording here."""
        rec = self.recorder or self._start
        if rec is None:
            return
        limits = self._limits.get(id(rec))
        if limits and limits[1] is not None and time.monotonic() >= limits[1] and not self._busy():
            try:
                self.stop("time limit")
            except RecordingError:
                pass

    def shutdown(self, timeout: float = 30.0) -> None:
        """The engine is going away: seal the running recording (waiting is fine now)."""
        with self._lock:
            rec = self.recorder or self._start
            self._start = None
            if rec is not None:
                self.recorder = rec
                self._finish(rec, "engine shutdown")
        if rec is not None:
            rec.writer.wait_closed(timeout)

    def disarm(self) -> None:
        """Remove the hooks (tests, benchmarks); a running recording is closed first."""
        self.shutdown()
        sched = self.scheduler
        if self._sched_shadowed is not None:
            sched.schedule = self._sched_shadowed
        else:
            sched.__dict__.pop("schedule", None)
        if self.executor is not None:
            if self._exec_shadowed is not None:
                self.executor.execute_model = self._exec_shadowed
            else:
                self.executor.__dict__.pop("execute_model", None)
        self.disarmed = True
        self.pending = False

    # -- description ------------------------------------------------------------------------------
    @staticmethod
    def ended(entry: dict) -> dict:
        """A finished recording, for the control socket: `sealed` once its writer has written
        the last rows and the manifest (it does so on its own thread after the stop)."""
        rec = entry["_recorder"]
        sealed = not rec.writer.alive()
        m = rec.writer.manifest
        return {**{k: v for k, v in entry.items() if not k.startswith("_")},
                "steps": m["steps_recorded"] if sealed else entry["steps"],
                "sealed": sealed, "failed": rec.failed,
                "closed_cleanly": bool(m.get("closed_cleanly")) if sealed else None,
                "dropped_steps_total": m.get("dropped_steps_total", 0),
                "errors": [e["error"] for e in m["recorder_errors"]]}

    def transport_info(self) -> dict:
        r = self.receipts
        return {"executor": None if self.executor is None else type(self.executor).__name__,
                "receipts": None if r is None else r.kind,
                "workers": [] if r is None else r.workers}

    def describe(self) -> dict:
        cfg = getattr(self.scheduler, "vllm_config", None)
        model = getattr(getattr(cfg, "model_config", None), "model", None)
        rec = self.recorder
        starting = self._start
        state = "recording" if rec is not None else "starting" if starting is not None else "armed"
        cur = rec or starting
        limits = self._limits.get(id(cur)) if cur is not None else None
        out = {
            "index": self.index, "model": model, "dp_rank": dp_rank(self.scheduler),
            "scheduler_class": type(self.scheduler).__qualname__,
            "executor": None if self.executor is None else type(self.executor).__name__,
            "armed_at": self.armed_at, "state": state,
            "trace": None if cur is None else str(cur.path),
            "steps": None if cur is None else cur.step,
            "limits": None if not limits else {
                "steps": limits[0],
                "seconds_left": None if limits[1] is None else max(0.0, limits[1] - time.monotonic())},
            "last": self.ended(self.history[-1]) if self.history else None,
        }
        return out
