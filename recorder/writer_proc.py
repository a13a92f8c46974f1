"""The writer in a process of its own: what the engine thread keeps is one pickle and one
memcpy per item.

In a writer thread, turning snapshots into Arrow batches holds the engine's GIL for Python work
on every step, and the engine slowed in whole runs
(bench/RESULTS.md). Here the engine thread pickles each queue item (handoff.py: plain data
only, no vLLM object crosses) into a shared-memory ring (ring.py) and goes on; a child process,
started from this file, reads the ring and runs an ordinary TraceWriter on the items. The child
imports no vLLM and never blocks the engine: an item the ring has no room for is dropped and
the gap recorded, as in the thread writer (or, with on_full="block", waited for).

If the engine process ends without closing (SIGKILL, a crash), the child reads the end of the
commit pipe, writes every item it was given and marks the trace not closed cleanly. If the
child dies, the engine's next commit fails and recording stops with one log line and a note in
the manifest.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from vllm_contract import schema
from vllm_contract.recorder import handoff
from vllm_contract.recorder.records import (
    STOP, Dropped, Error, Finish, Flush, Init, Malformed, Manifest, Schedule, Stop, Transport,
    Update)
from vllm_contract.recorder.ring import ACK, FAILED, RingReader, RingWriter
from vllm_contract.recorder.segments import write_json_atomic
from vllm_contract.recorder.snapshot import Fields, plain_form
from vllm_contract.recorder.writer import (
    DEFAULTS, new_engine_dir, check_options, engine_dir_name, new_manifest)

log = logging.getLogger("vllm.vllm_contract")  # under vLLM's logger: our lines join its log

# The ring holds this many bytes at most (less when max_pending_bytes is smaller): about 1,200
# steps at 256 running requests, while the child keeps up to max_pending steps of its own.
# Its pages are allocated at the start (ring.py).
RING_BYTES = 16 << 20


def available() -> bool:
    return sys.platform == "linux" and hasattr(os, "memfd_create")


class ProcessWriter:
    """writer_api.Writer from the engine process's side. It takes the SchedulerOutput and
    ModelRunnerOutput themselves: the pickle is the snapshot, and the child makes the
    snapshot.py form of it."""

    def __init__(self, trace_dir: str | os.PathLike, manifest: dict, fields: Fields, *,
                 dp_rank: int = 0, **options: Any) -> None:
        """options: TraceWriter's (writer.DEFAULTS); the child's TraceWriter gets them."""
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown writer options: {', '.join(sorted(unknown))}")
        options = {**DEFAULTS, **options}
        options["segment_bytes"] = check_options(options["on_full"], options["segment_bytes"],
                                                 options["max_trace_bytes"])
        self.dir = new_engine_dir(Path(trace_dir),
                                   engine_dir_name(socket.gethostname(), os.getpid(), dp_rank))
        first = new_manifest(manifest, dp_rank, process=True, **options)
        write_json_atomic(self.dir / schema.MANIFEST, first)  # a trace exists from here on
        self.block_when_full = options["on_full"] == "block"
        self._failed = False
        self._child_failed = False
        self._stopping = False
        self._barrier = 0
        self._dropped: list[int] = []  # steps the ring had no room for, told with the next item
        self._backlog: deque[bytes] = deque()  # non-step items that found no room: sent first
        self._encoder = handoff.Encoder()
        self.ring = RingWriter(max(1 << 20, min(RING_BYTES, options["max_pending_bytes"])))
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             "from vllm_contract.recorder.writer_proc import child_main; child_main()",
             str(self.ring.fd), str(self.ring.commit_r), str(self.ring.wake_r),
             str(self.ring.capacity)],
            pass_fds=(self.ring.fd, self.ring.commit_r, self.ring.wake_r),
            stdin=subprocess.DEVNULL,
            # A Ctrl-C to the engine's process group must not cost the rows the child holds:
            # it ends when the commit pipe does.
            start_new_session=True)
        self.ring.close_reader_end()  # the child's now
        init = Init(str(self.dir), first, options, fields.to_dict())
        if not self._put(handoff.encode_control(init)):
            raise RuntimeError("the writer ring cannot hold the first item")

    @property
    def failed(self) -> bool:
        if self._failed:
            return True
        if self.ring.mm.closed:  # after wait_closed(): what the child said last
            return self._child_failed
        return bool(self.ring.header(FAILED))

    # -- engine thread (writer_api.Writer) ---------------------------------------------------
    def submit_schedule(self, step: int, t_ns: int, dur_ns: int, state: tuple,
                        scheduler_output: Any) -> bool:
        """Never waits (unless on_full="block"). A step the ring has no room for is dropped and
        its number sent with the next item that fits."""
        if self._failed:
            return False
        try:
            data = self._encoder.encode_record(
                Schedule(step, t_ns, dur_ns, state, scheduler_output))
        except Exception as e:  # cannot be pickled (a cycle): quarantined, recording goes on
            self._submit(Malformed(step, t_ns, "snapshot", f"{type(e).__name__}: {e}",
                                   plain_form(scheduler_output)))
            return True
        # Committed with the step's update.
        if not self._catch_up() or not self._put(data, commit=False):
            if not (self.block_when_full and self._wait_for_room(len(data))
                    and self._put(data, commit=False)):
                self._dropped.append(step)
                return False
        return True

    def keep_model_output(self, model_runner_output: Any) -> bytes:
        """The model output's pickle, sent later inside its Update."""
        return self._encoder.encode(model_runner_output)

    def submit_update(self, step: int, t_ns: int, dur_ns: int, model_output: bytes,
                      finishes: Any, transport: Any) -> None:
        self._submit(Update(step, t_ns, dur_ns, model_output, finishes, transport))

    def submit_finish(self, step: int, t_ns: int, source: str, finishes: list) -> None:
        self._submit(Finish(step, t_ns, source, finishes))

    def submit_transport(self, step: int, rows: list) -> None:
        self._submit(Transport(step, rows))

    def submit_input(self, record: tuple) -> None:
        self._submit(record)

    def _submit(self, item: tuple) -> None:
        """Queue a record that is not a step's schedule; one the ring has no room for now is
        sent before the next."""
        if self._failed:
            return
        data = self._encoder.encode_record(item)
        if not self._catch_up() or not self._put(data):
            self._backlog.append(data)

    def _catch_up(self) -> bool:
        """Send what waits (dropped step numbers, then refused items); True when nothing does."""
        if self._dropped:
            if not self._put(handoff.encode_control(Dropped(self._dropped))):
                return False
            self._dropped = []
        while self._backlog:
            if not self._put(self._backlog[0]):
                return False
            self._backlog.popleft()
        return True

    def _put(self, data: bytes, commit: bool = True) -> bool:
        try:
            return self.ring.put(data, commit)
        except OSError as e:  # BrokenPipeError: the child is gone
            self._child_gone(e)
            return False

    def _wait_for_room(self, need: int) -> bool:
        """on_full="block": the engine waits for room (never for a dead child)."""
        while self.ring.free() < need + 64:
            if self.failed or self._stopping or not self.alive():
                return False
            if need + 64 > self.ring.capacity:  # one item larger than the whole ring
                return False
            self.ring.wake()
            time.sleep(0.0005)
        return True

    def _send(self, item: tuple, timeout: float) -> bool:
        """A control item that must arrive: waits for room up to timeout (also after a
        failure: the child still has to note it and seal the trace)."""
        data = handoff.encode_control(item)
        deadline = time.monotonic() + timeout
        while not self.ring.closed_commits:
            if self._catch_up() and self._put(data):
                self.ring.wake()
                return True
            if time.monotonic() > deadline or not self.alive():
                return False
            time.sleep(0.001)
        return False

    def update_manifest(self, **values: Any) -> None:
        """Merge keys into the manifest (written by the child)."""
        data = handoff.encode_control(Manifest(values))
        if not self._catch_up() or not self._put(data):
            self._backlog.append(data)

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is written; False on timeout or failure."""
        self._barrier += 1
        seq = self._barrier
        deadline = time.monotonic() + timeout
        if not self._send(Flush(seq), timeout):
            return False
        while self.ring.header(ACK) < seq:
            if self.failed or not self.alive() or time.monotonic() > deadline:
                return False
            time.sleep(0.0005)
        return not self.failed

    def fail(self, e: BaseException) -> None:
        """From the engine thread: recording is disabled; the child notes why in the manifest
        (at once if the ring has room, else at close)."""
        if self._failed:
            return
        self._failed = True
        try:  # never raises into the engine, even if what failed was our pickling
            data = handoff.encode_control(Error(f"{type(e).__name__}: {e}", time.time()))
            if not self._catch_up() or not self._put(data):
                self._backlog.append(data)
        except Exception as e2:
            log.error("vllm-contract: cannot note the error: %s", e2)

    def close(self, timeout: float = 30.0, wait: bool = True) -> bool:
        """Send the stop and end the commit pipe; with wait, wait for the child to seal the
        trace. Returns whether it has finished."""
        if not self._stopping:
            self._stopping = True
            self._send(STOP, timeout)
            try:
                self.ring.close_commits()
            except OSError:
                pass
        return self.wait_closed(timeout) if wait else not self.alive()

    def wait_closed(self, timeout: float = 30.0) -> bool:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        if not self.ring.mm.closed:
            self._child_failed = bool(self.ring.header(FAILED))
            self.ring.close()
        return True

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def manifest(self) -> dict:
        """The manifest as the child last wrote it."""
        return json.loads((self.dir / schema.MANIFEST).read_text())

    def _child_gone(self, e: BaseException) -> None:
        if self._failed:
            return
        self._failed = True
        code = self.proc.poll()
        msg = f"the writer process ended unexpectedly (exit code {code}): {type(e).__name__}"
        log.error("vllm-contract: recording disabled: %s", msg)
        try:  # the child cannot write this note any more
            m = self.manifest
            m["recorder_errors"].append({"time": time.time(), "error": msg})
            write_json_atomic(self.dir / schema.MANIFEST, m)
        except Exception as e2:
            log.error("vllm-contract: cannot update the manifest: %s", e2)


def child_main() -> None:
    """The writer process: read items from the ring until the stop or the end of the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd, commit_fd, wake_fd, capacity = map(int, sys.argv[1:5])
    reader = RingReader(fd, commit_fd, wake_fd, capacity)
    w = None
    told_failed = False
    dropped: set[int] = set()  # steps this writer dropped: their updates go too (no orphans)
    busy = False
    while True:
        more = reader.wait(busy)
        busy = reader.pending()
        for data in reader.items():
            item = handoff.decode_record(data)
            if type(item) is Init:
                w = _child_writer(item)
            elif type(item) is Stop:
                w.close(timeout=600)
                return
            else:
                _take(w, item, data, reader, dropped)
        if w is not None and w.failed and not told_failed:
            told_failed = True
            reader.set(FAILED, 1)
        if not more:
            if w is not None:
                w.ended_unclean = True
                w.update_manifest(ended_by="the engine process ended without closing the "
                                           "recording; the writer process wrote what it had")
                w.close(timeout=600)
            return


def _child_writer(init: Init) -> Any:
    from vllm_contract.recorder.writer import TraceWriter

    return TraceWriter(None, init.manifest, Fields.from_dict(init.fields),
                       engine_dir=Path(init.engine_dir), **init.options)


def _take(w: Any, item: tuple, data: bytes, reader: RingReader, dropped: set[int]) -> None:
    """One record from the ring into the child's TraceWriter, through the calls the engine's
    own writer thread would get, with the objects the pickles made."""
    t = type(item)
    if t is Schedule:  # the pickle's size is what it kept queued
        if not w.submit_schedule(item.step, item.t_ns, item.dur_ns, item.state, item.out,
                                 cost=len(data)):
            dropped.add(item.step)
    elif t is Update:
        if item.step in dropped:
            dropped.discard(item.step)
            return
        m = w.keep_model_output(handoff.decode(item.model_output))
        w.submit_update(item.step, item.t_ns, item.dur_ns, m, item.finishes, item.transport)
    elif t is Flush:
        w.flush(timeout=600)
        reader.set(ACK, item.seq)
    elif t is Dropped:
        w.note_dropped(item.steps)
    elif t is Manifest:
        w.update_manifest(**item.values)
    elif t is Error:  # the engine side failed: as TraceWriter.fail() there
        w.note_failure(item.error, item.when)
    else:  # Finish, Transport, Malformed, Input: as they are
        w.put(item)


if __name__ == "__main__":
    child_main()
