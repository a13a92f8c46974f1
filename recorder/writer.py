"""The background writer: takes snapshots from a queue, turns them into Arrow batches and writes
segments, flushing every `flush_steps` steps or `flush_seconds`, whichever comes first.

The engine never waits for it: the recorder counts the steps pending (and their estimated bytes)
and drops, recording the gap, beyond `max_pending` steps or `max_pending_bytes`; only
`on_full="block"` makes the engine wait instead. With `max_trace_bytes` the oldest closed segments
are deleted to stay under it, and their steps are listed as a gap. Any exception here disables
recording with one log line and a note in the manifest; it never reaches the engine.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from vllm_contract import liveness, schema
from vllm_contract.recorder import snapshot
from vllm_contract.recorder.columns import warm_up
from vllm_contract.recorder.records import (
    STOP, Barrier, Drop, Error, Finish, Input, Malformed, Manifest, Schedule, Stop, Transport,
    Update)
from vllm_contract.recorder.reserve import Reserve
from vllm_contract.recorder.rows import REDACTED_FIELDS, Columns
from vllm_contract.recorder.segments import SegmentSet, write_json_atomic

log = logging.getLogger("vllm.vllm_contract")  # under vLLM's logger: our lines join its log

def engine_dir_name(host: str, pid: int, dp_rank: int) -> str:
    return f"{schema.ENGINE_DIR_PREFIX}{host}-{pid}-dp{dp_rank}"


def new_engine_dir(root: Path, name: str) -> Path:
    """An engine home (TRACE/_engines/<name>) no other recording uses: a second attach() in
    the same process and rank gets `<name>.1`, and so on. Never reuse one: its segments would
    be truncated."""
    root = root / schema.ENGINES_DIR
    root.mkdir(parents=True, exist_ok=True)
    for k in range(10_000):
        path = root / (name if k == 0 else f"{name}.{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{root}: no free engine directory for {name}")


def _lower_priority() -> None:
    """The writer thread runs at the lowest CPU priority (Linux: per-thread nice 19): when
    the engine's own threads keep every core busy (CPU inference), the kernel runs them first."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


YIELD_S = 0.0005
_next_yield = 0.0


def _yield_gil() -> None:
    """Give a waiting engine thread the GIL, at most every YIELD_S of the writer's work.

    Otherwise the writer, once it holds the GIL, keeps it for a whole switch interval (5 ms)
    whenever the engine thread comes back from a torch call and wants it: a flush's worth of
    Python work then stretches the engine's steps by about as much again (measured in
    bench/live_overhead.py). Yielding after every item instead costs more than it saves."""
    global _next_yield
    now = time.perf_counter()
    if now >= _next_yield:
        time.sleep(0)
        _next_yield = now + YIELD_S


# The writer options and their defaults, for both writers (writer.py, writer_proc.py).
DEFAULTS = {"flush_steps": 64, "flush_seconds": 1.0, "segment_bytes": 64 << 20,
            "max_pending": 16384, "max_pending_bytes": 256 << 20, "max_trace_bytes": None,
            "on_full": "drop", "redact_prompts": False, "pickle_opaque": False}


def check_options(on_full: str, segment_bytes: int, max_trace_bytes: int | None) -> int:
    """Validates on_full; returns the segment size to use."""
    if on_full not in ("drop", "block"):
        raise ValueError(f"on_full={on_full!r}: use 'drop' or 'block'")
    if max_trace_bytes:
        # At least four segments fit: pruning deletes whole closed segments.
        segment_bytes = max(1, min(segment_bytes, max_trace_bytes // 4))
    return segment_bytes


def new_manifest(manifest: dict, dp_rank: int, *, flush_steps: int, flush_seconds: float,
                 segment_bytes: int, max_pending: int, max_pending_bytes: int,
                 max_trace_bytes: int | None, on_full: str, redact_prompts: bool,
                 pickle_opaque: bool, process: bool) -> dict:
    m = {
        "format_version": schema.FORMAT_VERSION,
        "host": socket.gethostname(), "pid": os.getpid(), "dp_rank": dp_rank,
        "started_at": time.time(), "ended_at": None, "closed_cleanly": False,
        "recorder_errors": [], "steps_recorded": 0, "dropped_steps": [],
        "pickled_opaque": pickle_opaque,
        "redacted_prompts": redact_prompts,
        "writer": {"flush_steps": flush_steps, "flush_seconds": flush_seconds,
                   "segment_bytes": segment_bytes, "max_trace_bytes": max_trace_bytes,
                   "max_pending": max_pending, "max_pending_bytes": max_pending_bytes,
                   "on_full": on_full, "process": process},
        **manifest,
    }
    if redact_prompts:
        m["redaction"] = {
            "fields": list(REDACTED_FIELDS),
            "hash": "sha256 of the token ids as little-endian int64 (table `redacted`)",
        }
        m["worker_replayable"] = False
    return m


def _cost(snap: snapshot.Scheduled) -> int:
    """Rough bytes a queued schedule snapshot (and its update) keeps alive: for the pending
    budget, so it must be cheap, not exact."""
    prompts = 0
    for item in snap.new:
        p = item["req"].prompt_token_ids
        prompts += len(p) if p is not None else 0
    return 1024 + 160 * len(snap.num_scheduled_tokens) + 40 * prompts


class TraceWriter:
    """writer_api.Writer in a thread of the engine's process; also the writer process's own
    writer (writer_proc.py), which drives it through the same calls."""

    def __init__(self, trace_dir: str | os.PathLike | None, manifest: dict,
                 fields: snapshot.Fields, *, dp_rank: int = 0,
                 flush_steps: int = DEFAULTS["flush_steps"],
                 flush_seconds: float = DEFAULTS["flush_seconds"],
                 segment_bytes: int = DEFAULTS["segment_bytes"],
                 max_pending: int = DEFAULTS["max_pending"],
                 max_pending_bytes: int = DEFAULTS["max_pending_bytes"],
                 max_trace_bytes: int | None = DEFAULTS["max_trace_bytes"],
                 on_full: str = DEFAULTS["on_full"],
                 redact_prompts: bool = DEFAULTS["redact_prompts"],
                 pickle_opaque: bool = DEFAULTS["pickle_opaque"],
                 engine_dir: Path | None = None) -> None:
        """With engine_dir (a writer process's writer), the engine process has made the
        directory and the whole manifest already, and trace_dir is not used."""
        segment_bytes = check_options(on_full, segment_bytes, max_trace_bytes)
        if engine_dir is not None:
            self.dir, self.manifest = Path(engine_dir), manifest
        else:
            self.dir = new_engine_dir(Path(trace_dir),
                                       engine_dir_name(socket.gethostname(), os.getpid(), dp_rank))
            self.manifest = new_manifest(
                manifest, dp_rank, flush_steps=flush_steps, flush_seconds=flush_seconds,
                segment_bytes=segment_bytes, max_pending=max_pending,
                max_pending_bytes=max_pending_bytes, max_trace_bytes=max_trace_bytes,
                on_full=on_full, redact_prompts=redact_prompts, pickle_opaque=pickle_opaque,
                process=False)
        self._lock = liveness.hold(self.dir)
        self.fields = fields
        self.flush_steps = flush_steps
        self.flush_seconds = flush_seconds
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.max_trace_bytes = max_trace_bytes
        self.block_when_full = on_full == "block"
        self.failed = False
        self.ended_unclean = False  # a writer process whose engine ended without close()
        # Each counter has one writing thread, so none needs a lock: pending = submitted - taken.
        self.submitted = 0  # engine thread
        self.taken = 0  # writer thread
        self.submitted_bytes = 0  # engine thread: estimated bytes of the snapshots queued
        self.taken_bytes = 0  # writer thread
        self._dropping_from: int | None = None
        self._last_drop = -1
        self._cols = Columns(redact_prompts=redact_prompts)
        self._items: deque = deque()  # append/popleft are atomic
        self._wake = threading.Event()
        self._stopping = False
        self._committed_step: int | None = None  # the last step of the last whole flush
        self._unflushed_steps = 0
        try:
            self._reserve: Reserve | None = Reserve(self.dir)
        except OSError as e:  # no room even for the reserve: record nothing, say why
            self._reserve = None
            self._fail(e)
        self._segments: SegmentSet | None = None
        if not self.failed:
            try:
                self._segments = SegmentSet(self.dir, segment_bytes)
            except OSError as e:
                self._fail(e)
        warm_up()
        self._write_manifest()
        self._thread = threading.Thread(target=self._run, name="vllm-contract-writer", daemon=True)
        self._thread.start()

    # -- engine thread (writer_api.Writer) ---------------------------------------------------
    def submit_schedule(self, step: int, t_ns: int, dur_ns: int, state: tuple,
                        scheduler_output: Any, cost: int | None = None) -> bool:
        """Snapshot a SchedulerOutput and queue it. cost: the bytes it keeps queued, when the
        caller knows them (a writer process: the item's size); else estimated here."""
        try:
            snap = snapshot.scheduler_output(scheduler_output, self.fields)
            if cost is None:
                cost = _cost(snap)
        except Exception as e:  # a malformed output: quarantined, recording goes on
            self._items.append(Malformed(step, t_ns, "snapshot", f"{type(e).__name__}: {e}",
                                         snapshot.plain_form(scheduler_output)))
            return True
        return self.put_schedule(Schedule(step, t_ns, dur_ns, state, snap, cost))

    def put_schedule(self, item: Schedule) -> bool:
        """Queue a snapshot. The writer is woken once per flush_steps steps, not per step: every
        wake-up costs the engine a GIL hand-over. A schedule snapshot over the budget (steps or
        estimated bytes pending) is dropped, or with on_full="block" waited for."""
        cost = item.cost
        pending = self.submitted - self.taken
        if (pending >= self.max_pending
                or self.submitted_bytes - self.taken_bytes + cost > self.max_pending_bytes):
            if not (self.block_when_full and self._wait_for_room(cost)):
                self._items.append(Drop(item.step))
                return False
            pending = self.submitted - self.taken
        self.submitted += 1
        self.submitted_bytes += cost
        self._items.append(item)
        if pending + 1 >= self.flush_steps:
            self._wake.set()
        return True

    def keep_model_output(self, model_runner_output: Any) -> dict:
        return snapshot.model_output(model_runner_output, self.fields)

    def submit_update(self, step: int, t_ns: int, dur_ns: int, model_output: Any,
                      finishes: Any, transport: Any) -> None:
        self._items.append(Update(step, t_ns, dur_ns, model_output, finishes, transport))

    def submit_finish(self, step: int, t_ns: int, source: str, finishes: list) -> None:
        self._items.append(Finish(step, t_ns, source, finishes))

    def submit_transport(self, step: int, rows: list) -> None:
        self._items.append(Transport(step, rows))

    def submit_input(self, record: tuple) -> None:
        self._items.append(record)

    def put(self, item: tuple) -> None:
        """Queue a record that is not a step's schedule (records.py), as it is."""
        self._items.append(item)

    def _wait_for_room(self, cost: int) -> bool:
        """on_full="block": the engine waits for the writer (never for a dead one)."""
        while (self.submitted - self.taken >= self.max_pending
               or self.submitted_bytes - self.taken_bytes + cost > self.max_pending_bytes):
            if self.failed or self._stopping or not self._thread.is_alive():
                return False
            if self.submitted == self.taken:  # one snapshot larger than the whole budget
                return True
            self._wake.set()
            time.sleep(0.0005)
        return True

    def update_manifest(self, **values) -> None:
        """Merge keys into the manifest; written by the writer thread, never the engine's."""
        self._items.append(Manifest(values))
        self._wake.set()

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is written; False on timeout or failure."""
        done = threading.Event()
        self._items.append(Barrier(done))
        self._wake.set()
        return done.wait(timeout) and not self.failed

    def close(self, timeout: float = 30.0, wait: bool = True) -> bool:
        """Write what is queued, close the segments and the manifest. With wait=False the writer
        thread finishes on its own (the engine thread never waits for disk); wait_closed() joins.
        Returns whether the writer has finished."""
        if not self._stopping:
            self._stopping = True
            self._items.append(STOP)
            self._wake.set()
        return self.wait_closed(timeout) if wait else not self._thread.is_alive()

    def wait_closed(self, timeout: float = 30.0) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        _lower_priority()
        last_flush = time.monotonic()
        while True:
            self._wake.wait(max(0.0, self.flush_seconds - (time.monotonic() - last_flush)))
            self._wake.clear()
            barriers = []
            while self._items:
                item = self._items.popleft()
                t = type(item)
                if t is Stop:
                    self._finish()
                    for done in barriers:
                        done.set()
                    return
                if t is Barrier:
                    barriers.append(item.done)
                elif t is Manifest or t is Error:  # also after a failure: the note counts
                    try:
                        self._take(item)
                    except Exception as e:
                        log.error("vllm-contract: cannot update the manifest: %s", e)
                elif not self.failed:
                    _yield_gil()
                    try:
                        self._take(item)
                        if self._cols.steps >= self.flush_steps:  # batches of <= flush_steps
                            self._flush()
                            last_flush = time.monotonic()
                    except Exception as e:  # the engine must never pay for a recorder bug
                        self._fail(e)
            if not self.failed and (barriers or self._cols.steps >= self.flush_steps
                                    or time.monotonic() - last_flush >= self.flush_seconds):
                try:
                    self._flush()
                except Exception as e:
                    self._fail(e)
                last_flush = time.monotonic()
            for done in barriers:
                done.set()

    def _take(self, item: tuple) -> None:
        t = type(item)
        if t is Schedule:
            self.taken += 1
            self.taken_bytes += item.cost
            self._end_gap(item.step)
            if self._cols.add_schedule(item.step, item.t_ns, item.dur_ns, item.state, item.out):
                self._unflushed_steps += 1  # recorded once a whole flush holds them
            else:
                self._count_malformed(1)
        elif t is Update:
            self._cols.add_update(item.step, item.t_ns, item.dur_ns, item.model_output,
                                  item.finishes, item.transport)
        elif t is Malformed:
            self._end_gap(item.step)
            self._cols.quarantine(item.step, item.t_ns, item.stage, item.error, item.value)
            self._count_malformed(1)
        elif t is Finish:
            self._cols.add_finishes(item.step, item.t_ns, item.source, item.finishes)
        elif t is Transport:
            self._cols.add_transport(item.step, item.rows)
        elif t is Input:
            self._cols.add_input(item)
        elif t is Manifest:
            self.manifest.update(item.values)
            self._write_manifest()
        elif t is Error:
            self.manifest["recorder_errors"].append({"time": item.when, "error": item.error})
            self._write_manifest()
        elif t is Drop:
            step = item.step
            self._last_drop = step
            if self._dropping_from is None:
                self._dropping_from = step
                if not self.manifest["dropped_steps"]:  # one line, not one per gap
                    log.warning("vllm-contract: writer behind, dropping steps from %d (gaps are "
                                "listed in the manifest)", step)
            self.manifest["dropped_steps_total"] = self.manifest.get("dropped_steps_total", 0) + 1
        else:
            raise TypeError(f"not a writer record: {t.__name__}")

    def _end_gap(self, step: int) -> None:
        if self._dropping_from is not None:
            self._add_gap(self._dropping_from, step - 1)
            self._dropping_from = None

    def _add_gap(self, first: int, last: int) -> None:
        gaps = self.manifest["dropped_steps"]
        gaps.append([first, last])
        gaps.sort()

    def _count_malformed(self, n: int) -> None:
        if n:
            self.manifest["steps_malformed"] = self.manifest.get("steps_malformed", 0) + n

    def _flush(self) -> None:
        if any(self._cols.rows(t) for t in schema.TABLE_NAMES):
            batches = self._cols.drain(_yield_gil)
            salvaged, self._cols.salvaged = self._cols.salvaged, 0  # quarantined at conversion
            rotated = self._segments.write(batches)
            self.manifest["steps_recorded"] += self._unflushed_steps - salvaged
            self._count_malformed(salvaged)
            self._unflushed_steps = 0
            if batches["steps"].num_rows:
                self._committed_step = batches["steps"].column("step")[-1].as_py()
            if rotated and self.max_trace_bytes:
                self._prune()

    def _prune(self) -> None:
        """Delete the oldest closed segments until the trace fits in max_trace_bytes; their
        steps become a gap in dropped_steps (details in pruned_segments)."""
        pruned = self._segments.prune(self.max_trace_bytes)
        if not pruned:
            return
        log_first = "pruned_segments" not in self.manifest
        for seg in pruned:
            self.manifest.setdefault("pruned_segments", []).append(seg)
            if seg["steps"] is not None:
                first, last = seg["steps"]
                self._add_gap(first, last)
                self.manifest["dropped_steps_total"] = (
                    self.manifest.get("dropped_steps_total", 0) + last - first + 1)
        if log_first:
            log.warning("vllm-contract: trace reached max_trace_bytes (%d); deleting the oldest "
                        "segments (gaps are listed in the manifest)", self.max_trace_bytes)
        self._write_manifest()

    def _finish(self) -> None:
        try:
            if not self.failed:
                self._flush()
            self._end_gap(self._last_drop + 1)
        except Exception as e:
            self._fail(e)
        finally:
            try:
                if self._segments is not None:
                    self._segments.close()
            except Exception as e:
                self._note_error(e)
            self.manifest["ended_at"] = time.time()
            self.manifest["closed_cleanly"] = not (self.failed or self.ended_unclean)
            if self._reserve is not None:  # a closed trace keeps no reserve
                self._reserve.release()
                self._reserve = None
            self._write_manifest()
            liveness.release(self._lock, self.dir)
            self._lock = None

    def fail(self, e: BaseException) -> None:
        """From the engine thread: recording is disabled; the writer notes why in the manifest
        (and writes it at once, so that a crash later does not lose the note)."""
        self.note_failure(f"{type(e).__name__}: {e}", time.time())

    def note_failure(self, error: str, when: float) -> None:
        """fail(), for an error already put in words (by a writer process's engine)."""
        if self.failed:
            return
        self.failed = True
        self._items.append(Error(error, when))
        self._wake.set()

    def note_dropped(self, steps: list[int]) -> None:
        """Steps dropped before they reached this writer (a writer process's full ring)."""
        for step in steps:
            self._items.append(Drop(step))

    def _fail(self, e: BaseException) -> None:
        self.failed = True
        log.error("vllm-contract: recording disabled after error: %s: %s", type(e).__name__, e)
        self._note_error(e)
        # Where the readable trace ends: readers cut a flush the failure tore at its last
        # whole one (see core/trace.py), so this is the last step they see.
        self.manifest["stopped"] = {"after_step": self._committed_step,
                                    "error": f"{type(e).__name__}: {e}"}
        self._write_manifest()

    def _note_error(self, e: BaseException) -> None:
        self.manifest["recorder_errors"].append(
            {"time": time.time(), "error": f"{type(e).__name__}: {e}"})

    def _write_manifest(self) -> None:
        for attempt in range(2):
            try:
                write_json_atomic(self.dir / schema.MANIFEST, self.manifest)
                return
            except Exception as e:
                reserve = getattr(self, "_reserve", None)
                if attempt == 0 and isinstance(e, OSError) and reserve is not None:
                    reserve.release()  # what it was kept for: the manifest's last word
                    self._reserve = None
                    continue
                log.error("vllm-contract: cannot write manifest: %s", e)
                return
