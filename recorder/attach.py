"""`attach(scheduler, trace_dir)`: record every schedule() / update_from_output() /
finish_requests() of one scheduler instance.

The wrappers are instance attributes, so only this scheduler is touched and close() restores it.
Every recorder failure is caught: the wrapped call's result is returned unchanged, always.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from vllm_contract.recorder import snapshot
from vllm_contract.recorder.engine_info import dp_rank, engine_settings
from vllm_contract.recorder.writer import TraceWriter

log = logging.getLogger("vllm_contract.recorder")

_WRAPPED = ("schedule", "update_from_output", "finish_requests")


def _vllm_version() -> str | None:
    try:
        import vllm

        return vllm.__version__
    except Exception:
        return None


class Recorder:
    """Handle returned by attach(); close() (or leaving the `with` block) stops and seals."""

    def __init__(self, scheduler: Any, trace_dir: str | os.PathLike, **writer_options: Any) -> None:
        self.scheduler = scheduler
        self.fields = snapshot.Fields(pickle_opaque=writer_options.get("pickle_opaque", False))
        self.step = 0
        self._inflight: dict[int, tuple[int, Any]] = {}
        self._closed = False
        self.paused = False
        manifest = {
            "vllm_version": _vllm_version(),
            "engine": engine_settings(scheduler),
            "fields": self.fields.all,
            "contract_drift": {
                "unknown_fields": {k: v for k, v in self.fields.drift.items() if v},
                "missing_fields": {k: v for k, v in self.fields.missing.items() if v},
            },
            # A worker attached mid-stream already holds requests we never saw introduced.
            "attached_mid_stream": bool(getattr(scheduler, "requests", None)),
        }
        self.writer = TraceWriter(trace_dir, manifest, dp_rank=dp_rank(scheduler), **writer_options)
        self.path = self.writer.dir
        self._originals = {name: getattr(scheduler, name) for name in _WRAPPED}
        # Someone else's instance-level wrapper (a test, another tool) is put back on close().
        self._shadowed = {n: scheduler.__dict__[n] for n in _WRAPPED if n in scheduler.__dict__}
        scheduler.schedule = self._schedule
        scheduler.update_from_output = self._update_from_output
        scheduler.finish_requests = self._finish_requests

    @property
    def active(self) -> bool:
        return not (self.paused or self._closed or self.writer.failed)

    def pause(self) -> None:
        """Stop recording at the next step boundary; the trace records the gap."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is on disk; False on timeout or failure."""
        return self.writer.flush(timeout)

    def _disable(self, e: BaseException) -> None:
        log.error("vllm-contract: recording disabled: %s: %s", type(e).__name__, e)
        self.writer.failed = True
        self.writer._note_error(e)

    # The three wrappers: the original call first and always; recording only after it.
    def _schedule(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = self._originals["schedule"](*args, **kwargs)
        if self.active:
            try:
                t1 = time.perf_counter_ns()
                s = self.scheduler
                snap = snapshot.scheduler_output(out, self.fields)
                state = (len(s.running), len(s.waiting), s.kv_cache_manager.usage)
                step = self.step
                self.step += 1
                # A dropped step (writer behind) keeps no model output either: no orphan rows.
                if self.writer.submit("schedule", step, time.time_ns(), t1 - t0, state, snap):
                    self._inflight[id(out)] = (step, out)
            except Exception as e:
                self._disable(e)
        return out

    def _update_from_output(self, scheduler_output: Any, model_runner_output: Any, *a: Any,
                            **kw: Any) -> Any:
        m = None
        if self.active:
            try:
                m = snapshot.model_output(model_runner_output, self.fields)
            except Exception as e:
                self._disable(e)
        t0 = time.perf_counter_ns()
        out = self._originals["update_from_output"](scheduler_output, model_runner_output, *a, **kw)
        t1 = time.perf_counter_ns()
        entry = self._inflight.pop(id(scheduler_output), None)
        if m is not None and entry is not None and entry[1] is scheduler_output and self.active:
            try:
                finishes = [(o.request_id, o.finish_reason.name)
                            for eco in out.values() for o in eco.outputs
                            if o.finish_reason is not None]
                self.writer.submit("update", entry[0], time.time_ns(), t1 - t0, m, finishes)
            except Exception as e:
                self._disable(e)
        return out

    def _finish_requests(self, *args: Any, **kwargs: Any) -> Any:
        out = self._originals["finish_requests"](*args, **kwargs)
        if self.active and out:
            try:
                finishes = [(r.request_id, r.status.name) for r in out]
                # Between steps: attributed to the last step schedule() returned.
                self.writer.submit("finish", self.step - 1, time.time_ns(), "finish_requests",
                                   finishes)
            except Exception as e:
                self._disable(e)
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in _WRAPPED:
            if name in self._shadowed:
                setattr(self.scheduler, name, self._shadowed[name])
            else:
                self.scheduler.__dict__.pop(name, None)
        self.writer.close()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def attach(scheduler: Any, trace_dir: str | os.PathLike, **writer_options: Any) -> Recorder:
    """Record every step of an in-process `scheduler` into `trace_dir`; returns a handle with
    close() that is also a context manager. Options: flush_steps, flush_seconds, segment_bytes,
    max_pending, pickle_opaque."""
    return Recorder(scheduler, trace_dir, **writer_options)
