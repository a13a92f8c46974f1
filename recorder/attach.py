"""`attach(scheduler, trace_dir)`: record every schedule() / update_from_output() /
finish_requests() of one scheduler instance.

The wrappers are instance attributes, so only this scheduler is touched and close() restores it.
Every recorder failure is caught: the wrapped call's result is returned unchanged, always.

The live-engine plugin (plugin.py, armed.py) uses the same Recorder with `install=False`: it is
built outside the engine's step loop (directory, manifest, writer thread) and installed by the
engine thread at a step boundary; its schedule() is driven by the plugin's gate, and the
executor hook reports each hand-off (`note_executed`) for the `transport` table.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from vllm_contract.recorder import input_log, snapshot, writer_proc
from vllm_contract.recorder.clock import now_ns
from vllm_contract.recorder.engine_info import dp_rank, engine_settings
from vllm_contract.recorder.records import Input
from vllm_contract.recorder.writer import TraceWriter
from vllm_contract.recorder.writer_api import Writer

log = logging.getLogger("vllm.vllm_contract")  # under vLLM's logger: our lines join its log

_WRAPPED = ("schedule", "update_from_output", "finish_requests")
# The input log's hooks, where the scheduler has the method (input_log.py).
_INPUTS = ("add_request", "update_draft_token_ids", "update_draft_token_ids_in_output")


def _vllm_version() -> str | None:
    try:
        import vllm

        return vllm.__version__
    except Exception:
        return None


def worker_state(scheduler: Any) -> dict:
    """What the worker already holds when a recording starts: requests it was introduced to
    (running, or preempted and waiting to resume) and finished ids not yet delivered to it."""
    requests = getattr(scheduler, "requests", None) or {}
    preempted = sum(1 for r in list(requests.values())
                    if getattr(getattr(r, "status", None), "name", None) == "PREEMPTED")
    return {"requests": len(getattr(scheduler, "running", ()) or ()) + preempted,
            "finished_ids": len(getattr(scheduler, "finished_req_ids", ()) or ())}


def kv_cache_state(scheduler: Any) -> dict | None:
    """The KV block pool as a recording starts: a new engine's hands blocks out in id order
    from an empty cache; one that has run before has its own free order (freed blocks go to
    the back) and may hold cached prefixes. The free order is kept so that a re-run can start
    from it (resim). Read once, at the start, never on a step."""
    try:
        pool = scheduler.kv_cache_manager.block_pool
        free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        cached = sum(1 for b in pool.blocks if b.block_hash is not None)
        fresh = free == sorted(free) and not cached and len(free) == pool.num_gpu_blocks - 1
        return {"fresh": fresh, "cached_blocks": cached,
                "free_blocks": None if fresh else free}
    except Exception:  # another vLLM's block pool: unknown, and the engine runs on
        return None


class Recorder:
    """Handle returned by attach(); close() (or leaving the `with` block) stops and seals."""

    def __init__(self, scheduler: Any, trace_dir: str | os.PathLike, *, install: bool = True,
                 wrap_schedule: bool = True, started_by: str = "attach()",
                 receipts: Any = None, manifest_extra: dict | None = None,
                 default_writer: str = "auto", **writer_options: Any) -> None:
        self.scheduler = scheduler
        self.fields = snapshot.Fields(pickle_opaque=writer_options.get("pickle_opaque", False))
        self.step = 0
        self._inflight: dict[int, list] = {}  # id(so) -> [step, so, hand-off seq or None]
        self._closed = False
        self._installed = False
        self._wrap_schedule = wrap_schedule
        self.receipts = receipts
        self.paused = False
        self.redacted = bool(writer_options.get("redact_prompts"))
        self.started_by = started_by
        # The input log: every call's place among all the recorded calls (input_log.py).
        self.seq = 0
        self.updates = 0
        self._depth = 0  # inside a wrapped call: a call it makes itself is not an input
        self._sched_args: tuple | None = None
        self._others = input_log.other_names()
        state = worker_state(scheduler) if install else None
        mid = bool(state["requests"] or state["finished_ids"]) if install else None
        manifest = {
            "vllm_version": _vllm_version(),
            "engine": engine_settings(scheduler),
            "fields": self.fields.all,
            "field_types": _field_types(),
            "contract_drift": {
                "unknown_fields": {k: v for k, v in self.fields.drift.items() if v},
                "missing_fields": {k: v for k, v in self.fields.missing.items() if v},
            },
            "started_by": started_by,
            # A worker attached mid-stream already holds requests we never saw introduced.
            "attached_mid_stream": mid,
            "worker_state_at_start": state,
            "kv_cache_at_start": kv_cache_state(scheduler) if install else None,
            "worker_replayable": not self.redacted and not mid,
            # the scheduler's calls besides schedule() and update (tables inputs, added)
            "input_log": {"calls": ["add_request", "finish_requests", *_INPUTS[1:],
                                    "schedule (its arguments)"],
                          "prompt_block_hashes": "salted per recording, the salt not kept"
                          if self.redacted else None},
            **(manifest_extra or {}),
        }
        self.writer: Writer = _start_writer(trace_dir, manifest, dp_rank(scheduler),
                                            writer_options, self.fields, default_writer)
        self.path = self.writer.dir
        if install:
            self.install(_initial=True)

    def install(self, _initial: bool = False) -> None:
        """Put the wrappers on the scheduler: from here on every step is recorded. The plugin
        calls this on the engine thread at a step boundary."""
        s = self.scheduler
        names = _WRAPPED if self._wrap_schedule else _WRAPPED[1:]
        names += tuple(n for n in _INPUTS if callable(getattr(s, n, None)))
        self._originals = {name: getattr(s, name) for name in names}
        # Someone else's instance-level wrapper (a test, another tool) is put back on close().
        self._shadowed = {n: s.__dict__[n] for n in names if n in s.__dict__}
        if self._wrap_schedule:
            s.schedule = self._schedule
        s.update_from_output = self._update_from_output
        s.finish_requests = self._finish_requests
        for name in names:
            if name in _INPUTS:
                setattr(s, name, getattr(self, "_" + name))
        self._installed = True
        self._log_waiting()
        if not _initial:
            state = worker_state(s)
            mid = bool(state["requests"] or state["finished_ids"])
            self.writer.update_manifest(
                attached_mid_stream=mid, worker_state_at_start=state,
                kv_cache_at_start=kv_cache_state(s),
                worker_replayable=not self.redacted and not mid,
                recording_started_at=time.time())

    def _log_waiting(self) -> None:
        """Requests added before the recording and not scheduled yet: logged as added now,
        so that a recording started on a queue (not mid-stream) still has every input."""
        if not self.active:
            return
        try:
            for req in list((getattr(self.scheduler, "requests", None) or {}).values()):
                name = getattr(getattr(req, "status", None), "name", "")
                if name.startswith("WAITING") and not getattr(req, "num_computed_tokens", 0):
                    self._input("add_request", input_log.request_fields(
                        req, self._others, self.redacted))
        except Exception as e:
            self._disable(e)

    def _input(self, call: str, payload: Any, step: int | None = None) -> None:
        """Log one input call at its place: after `step` (default: the last scheduled)."""
        self.writer.submit_input(Input(self.step - 1 if step is None else step, self.seq,
                                       self.updates, now_ns(), call, payload))
        self.seq += 1

    @property
    def active(self) -> bool:
        return not (self.paused or self._closed or self.writer.failed)

    @property
    def failed(self) -> bool:
        return self.writer.failed

    def pause(self) -> None:
        """Stop recording at the next step boundary; the trace records the gap."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is on disk; False on timeout or failure."""
        return self.writer.flush(timeout)

    def _disable(self, e: BaseException) -> None:
        if not self.writer.failed:
            log.error("vllm-contract: recording disabled: %s: %s", type(e).__name__, e)
        self.writer.fail(e)

    # The wrappers: the original call first and always; recording only after it.
    def _schedule(self, *args: Any, **kwargs: Any) -> Any:
        return self.record_schedule(self._originals["schedule"], args, kwargs)

    def record_schedule(self, original: Any, args: tuple, kwargs: dict) -> Any:
        t0 = time.perf_counter_ns()
        self._depth += 1
        try:
            out = original(*args, **kwargs)
        finally:
            self._depth -= 1
        if self.active:
            try:
                t1 = time.perf_counter_ns()
                s = self.scheduler
                state = (len(s.running), len(s.waiting), s.kv_cache_manager.usage)
                step = self.step
                self.step += 1
                if (args or kwargs or self._sched_args) and (args, kwargs) != self._sched_args:
                    # logged when they change: the engine passes the same flag most steps
                    self._sched_args = (args, dict(kwargs))
                    self._input("schedule", self._sched_args, step=step)  # this call's seq
                else:
                    self.seq += 1
                kept = self.writer.submit_schedule(step, now_ns(), t1 - t0, state, out)
                # A dropped step (writer behind) keeps no model output either: no orphan rows.
                if kept:
                    self._inflight[id(out)] = [step, out, None]
            except Exception as e:
                self._disable(e)
        return out

    def note_executed(self, scheduler_output: Any, seq: int) -> None:
        """The engine hands this step's output to its executor (hand-off number `seq`)."""
        if not self.active:
            return
        try:
            entry = self._inflight.get(id(scheduler_output))
            if entry is None or entry[1] is not scheduler_output:
                return
            # Written with the step's update (one queue item less per step), or at close.
            entry[2] = seq
            entry.append(("executed", None, seq, now_ns(),
                          scheduler_output.total_num_scheduled_tokens))
        except Exception as e:
            self._disable(e)

    def _update_from_output(self, scheduler_output: Any, model_runner_output: Any, *a: Any,
                            **kw: Any) -> Any:
        m = None
        if self.active:
            try:
                # Taken before update_from_output(), which trims sampled lists (spec decode).
                m = self.writer.keep_model_output(model_runner_output)
            except Exception as e:
                self._disable(e)
        t0 = time.perf_counter_ns()
        self._depth += 1
        try:
            out = self._originals["update_from_output"](scheduler_output, model_runner_output,
                                                        *a, **kw)
        finally:
            self._depth -= 1
        t1 = time.perf_counter_ns()
        entry = self._inflight.pop(id(scheduler_output), None)
        if entry is not None and entry[1] is scheduler_output:
            self.seq += 1
            self.updates += 1
        if m is not None and entry is not None and entry[1] is scheduler_output and self.active:
            try:
                finishes = [(o.request_id, o.finish_reason.name)
                            for eco in out.values() for o in eco.outputs
                            if o.finish_reason is not None]
                transport = entry[3:]
                if self.receipts is not None and entry[2] is not None:
                    for step, rows in self.receipts.collect(entry[0], entry[2]).items():
                        if step == entry[0]:
                            transport.extend(rows)
                        else:  # a lagging worker's receipt of an earlier step
                            self.writer.submit_transport(step, rows)
                # Empty lists become (): fewer containers held until the writer's next flush.
                self.writer.submit_update(entry[0], now_ns(), t1 - t0, m, finishes or (),
                                          transport or ())
            except Exception as e:
                self._disable(e)
        return out

    def _submit_receipts(self, by_step: dict) -> None:
        for step, rows in by_step.items():
            self.writer.submit_transport(step, rows)

    def _finish_requests(self, request_ids: Any, *args: Any, **kwargs: Any) -> Any:
        logged = self.active and not self._depth
        if logged and not (request_ids is None or isinstance(request_ids, (str, list, tuple,
                                                                             set, frozenset))):
            request_ids = list(request_ids)  # an iterator: read once, for vLLM and the log
        self._depth += 1
        try:
            out = self._originals["finish_requests"](request_ids, *args, **kwargs)
        finally:
            self._depth -= 1
        if self.active and (out or logged):
            try:
                finishes = [(r.request_id, r.status.name) for r in out or ()]
                if logged:
                    status = args[0] if args else kwargs.get("finished_status")
                    given = (None if request_ids is None else [request_ids]
                             if isinstance(request_ids, str) else list(request_ids))
                    self._input("finish_requests", (given, input_log.status_name(status),
                                                    [rid for rid, _ in finishes]))
                if finishes:
                    # Between steps: attributed to the last step schedule() returned.
                    self.writer.submit_finish(self.step - 1, now_ns(), "finish_requests",
                                              finishes)
            except Exception as e:
                self._disable(e)
        return out

    def _add_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        logged = not self._depth
        self._depth += 1
        try:
            out = self._originals["add_request"](request, *args, **kwargs)
        finally:
            self._depth -= 1
        if logged and self.active:
            try:
                self._input("add_request", input_log.request_fields(request, self._others,
                                                                    self.redacted))
            except Exception as e:
                self._disable(e)
        return out

    def _update_draft_token_ids(self, draft_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        return self._drafts("update_draft_token_ids", draft_token_ids, None, args, kwargs)

    def _update_draft_token_ids_in_output(self, draft_token_ids: Any, scheduler_output: Any,
                                          *args: Any, **kwargs: Any) -> Any:
        return self._drafts("update_draft_token_ids_in_output", draft_token_ids,
                            scheduler_output, args, kwargs)

    def _drafts(self, call: str, drafts: Any, so: Any, args: tuple, kwargs: dict) -> Any:
        payload = None
        logged = self.active and not self._depth
        if logged:
            try:  # before the call, which trims and pads the lists in place
                entry = None if so is None else self._inflight.get(id(so))
                payload = input_log.draft_lists(drafts) + (
                    entry[0] if entry is not None and entry[1] is so else None,)
            except Exception as e:
                self._disable(e)
        self._depth += 1
        try:
            original = self._originals[call]
            out = (original(drafts, *args, **kwargs) if so is None
                   else original(drafts, so, *args, **kwargs))
        finally:
            self._depth -= 1
        if payload is not None and self.active:
            try:
                self._input(call, payload)
            except Exception as e:
                self._disable(e)
        return out

    def close(self, wait: bool = True, timeout: float = 30.0) -> bool:
        """Take the wrappers off and seal the trace. wait=False returns at once (the engine
        thread never waits for the disk); the writer finishes on its own. Returns whether the
        writer has finished."""
        if self._closed:
            return self.writer.wait_closed(timeout) if wait else not self.writer.alive()
        if self.active:
            try:  # steps handed over but never answered, and receipts owed by lagging workers
                for step, _, seq, *executed in list(self._inflight.values()):
                    if seq is not None:
                        self.writer.submit_transport(step, executed)
                        if self.receipts is not None:
                            self._submit_receipts(self.receipts.collect(step, seq))
                if self.receipts is not None:
                    self._submit_receipts(self.receipts.collect(None, None))
            except Exception as e:
                self._disable(e)
        self._closed = True
        self._inflight.clear()  # outputs never answered: not ours to keep alive
        if self._installed:
            for name in self._originals:
                if name in self._shadowed:
                    setattr(self.scheduler, name, self._shadowed[name])
                else:
                    self.scheduler.__dict__.pop(name, None)
        return self.writer.close(timeout, wait=wait)

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


WRITER_ENV = "VLLM_CONTRACT_WRITER"


def _start_writer(trace_dir: Any, manifest: dict, rank: int, options: dict,
                  fields: snapshot.Fields, default: str = "auto") -> Writer:
    """The writer process where this platform has one (Linux), else the writer thread; option
    writer=, else VLLM_CONTRACT_WRITER, else `default` ("process", "thread", "auto") chooses. A
    process that cannot start falls back to the thread, with a warning."""
    options = dict(options)
    kind = options.pop("writer", None) or os.environ.get(WRITER_ENV) or default
    if kind not in ("auto", "process", "thread"):
        raise ValueError(f"writer={kind!r}: use 'process', 'thread' or 'auto'")
    # Pickled opaque payloads are pickles of the objects themselves, which only this process has.
    if kind != "thread" and writer_proc.available() and not options.get("pickle_opaque"):
        try:
            return writer_proc.ProcessWriter(trace_dir, manifest, fields, dp_rank=rank,
                                             **options)
        except (TypeError, ValueError):  # bad options: the caller's error, not the platform's
            raise
        except Exception as e:
            log.warning("vllm-contract: no writer process (%s: %s); writing from a thread",
                        type(e).__name__, e)
    return TraceWriter(trace_dir, manifest, fields, dp_rank=rank, **options)


def attach(scheduler: Any, trace_dir: str | os.PathLike, **writer_options: Any) -> Recorder:
    """Record every step of an in-process `scheduler` into `trace_dir`; returns a handle with
    close() that is also a context manager. Options: flush_steps, flush_seconds, segment_bytes,
    max_pending, max_pending_bytes, on_full, max_trace_bytes, redact_prompts, pickle_opaque,
    writer ("process" or "thread"; default: the process where the platform has one)."""
    return Recorder(scheduler, trace_dir, **writer_options)


def _field_types() -> dict | None:
    # for `contract --against TRACE` only: nothing it lacks may cost the engine its start
    try:
        return snapshot.field_types()
    except Exception:
        return None
