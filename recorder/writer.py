"""The background writer: takes snapshots from a queue, turns them into Arrow batches and writes
segments, flushing every `flush_steps` steps or `flush_seconds`, whichever comes first.

The engine never waits for it: the recorder counts the steps pending and drops (and records the
gap) beyond `max_pending` steps. Any exception here disables
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

from vllm_contract import schema
from vllm_contract.recorder.columns import warm_up
from vllm_contract.recorder.rows import Columns
from vllm_contract.recorder.segments import SegmentSet, write_json_atomic

log = logging.getLogger("vllm_contract.recorder")

_STOP = object()


def engine_dir_name(host: str, pid: int, dp_rank: int) -> str:
    return f"{schema.ENGINE_DIR_PREFIX}{host}-{pid}-dp{dp_rank}"


def _new_engine_dir(root: Path, name: str) -> Path:
    """A directory no other recording uses: a second attach() in the same process and rank
    gets `<name>.1`, and so on. Never reuse one: its segments would be truncated."""
    root.mkdir(parents=True, exist_ok=True)
    for k in range(10_000):
        path = root / (name if k == 0 else f"{name}.{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{root}: no free engine directory for {name}")


class TraceWriter:
    def __init__(self, trace_dir: str | os.PathLike, manifest: dict, *, dp_rank: int = 0,
                 flush_steps: int = 64, flush_seconds: float = 1.0,
                 segment_bytes: int = 64 << 20, max_pending: int = 16384,
                 pickle_opaque: bool = False) -> None:
        host = socket.gethostname()
        pid = os.getpid()
        self.dir = _new_engine_dir(Path(trace_dir), engine_dir_name(host, pid, dp_rank))
        self.manifest = {
            "format_version": schema.FORMAT_VERSION,
            "host": host, "pid": pid, "dp_rank": dp_rank,
            "started_at": time.time(), "ended_at": None, "closed_cleanly": False,
            "recorder_errors": [], "steps_recorded": 0, "dropped_steps": [],
            "pickled_opaque": pickle_opaque,
            **manifest,
        }
        self.flush_steps = flush_steps
        self.flush_seconds = flush_seconds
        self.max_pending = max_pending
        self.failed = False
        # Each counter has one writing thread, so neither needs a lock: pending = submitted - taken.
        self.submitted = 0  # engine thread
        self.taken = 0  # writer thread
        self._dropping_from: int | None = None
        self._last_drop = -1
        self._cols = Columns()
        self._items: deque = deque()  # append/popleft are atomic
        self._wake = threading.Event()
        self._segments = SegmentSet(self.dir, segment_bytes)
        warm_up()
        self._write_manifest()
        self._thread = threading.Thread(target=self._run, name="vllm-contract-writer", daemon=True)
        self._thread.start()

    # -- engine thread -------------------------------------------------------------------------
    def submit(self, kind: str, step: int, *payload) -> bool:
        """Queue a snapshot. The writer is woken once per flush_steps steps, not per step: every
        wake-up costs the engine a GIL hand-over."""
        if kind == "schedule":
            pending = self.submitted - self.taken
            if pending >= self.max_pending:
                self._items.append(("drop", step))
                return False
            self.submitted += 1
            if pending + 1 >= self.flush_steps:
                self._wake.set()
        self._items.append((kind, step, *payload))
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is written; False on timeout or failure."""
        done = threading.Event()
        self._items.append(("barrier", -1, done))
        self._wake.set()
        return done.wait(timeout) and not self.failed

    def close(self, timeout: float = 30.0) -> None:
        self._items.append(_STOP)
        self._wake.set()
        self._thread.join(timeout)

    # -- writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        last_flush = time.monotonic()
        while True:
            self._wake.wait(max(0.0, self.flush_seconds - (time.monotonic() - last_flush)))
            self._wake.clear()
            barriers = []
            while self._items:
                item = self._items.popleft()
                if item is _STOP:
                    self._finish()
                    for done in barriers:
                        done.set()
                    return
                if item[0] == "barrier":
                    barriers.append(item[2])
                elif not self.failed:
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
        kind, step = item[0], item[1]
        if kind == "schedule":
            self.taken += 1
            self._end_gap(step)
            self._cols.add_schedule(step, *item[2:])
            self.manifest["steps_recorded"] += 1
        elif kind == "update":
            self._cols.add_update(step, *item[2:])
        elif kind == "finish":
            self._cols.add_finishes(step, *item[2:])
        elif kind == "drop":
            self._last_drop = step
            if self._dropping_from is None:
                self._dropping_from = step
                if not self.manifest["dropped_steps"]:  # one line, not one per gap
                    log.warning("vllm-contract: writer behind, dropping steps from %d (gaps are "
                                "listed in the manifest)", step)
            self.manifest["dropped_steps_total"] = self.manifest.get("dropped_steps_total", 0) + 1

    def _end_gap(self, step: int) -> None:
        if self._dropping_from is not None:
            self.manifest["dropped_steps"].append([self._dropping_from, step - 1])
            self._dropping_from = None

    def _flush(self) -> None:
        if any(self._cols.rows(t) for t in schema.TABLE_NAMES):
            self._segments.write(self._cols.drain())

    def _finish(self) -> None:
        try:
            if not self.failed:
                self._flush()
            self._end_gap(self._last_drop + 1)
        except Exception as e:
            self._fail(e)
        finally:
            try:
                self._segments.close()
            except Exception as e:
                self._note_error(e)
            self.manifest["ended_at"] = time.time()
            self.manifest["closed_cleanly"] = not self.failed
            self._write_manifest()

    def _fail(self, e: BaseException) -> None:
        self.failed = True
        log.error("vllm-contract: recording disabled after error: %s: %s", type(e).__name__, e)
        self._note_error(e)
        self._write_manifest()

    def _note_error(self, e: BaseException) -> None:
        self.manifest["recorder_errors"].append(
            {"time": time.time(), "error": f"{type(e).__name__}: {e}"})

    def _write_manifest(self) -> None:
        try:
            write_json_atomic(self.dir / schema.MANIFEST, self.manifest)
        except Exception as e:
            log.error("vllm-contract: cannot write manifest: %s", e)
