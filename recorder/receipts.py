"""The worker end of the transport: which SchedulerOutputs a worker's execute_model() got.

Each armed worker keeps a ring of its last SLOTS receipts (hand-off number, wall clock,
total_num_scheduled_tokens). A worker in another process (MultiprocExecutor) keeps it in a small
memory-mapped file in the per-user run directory, `worker-<pid>.ring`; a worker in the engine's
own process (UniProcExecutor) in memory, put there by the engine when it is armed. The engine side
(`Receipts`) reads the rings when a step's update arrives and turns them into `received` rows.

The n-th execute_model() call the engine makes is the n-th one every worker receives (the
executor's message queue is ordered and drops nothing): both ends count from the moment they were
armed, i.e. from process start. Each row also carries the token total the worker saw, so a
miscount would show as a mismatch against the `executed` row, not as a silent wrong answer.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from pathlib import Path
from typing import Any

from vllm_contract.recorder.clock import now_ns

log = logging.getLogger("vllm.vllm_contract")  # under vLLM's logger: our lines join its log

MAGIC = b"VCR1"
SLOTS = 1024
_HEADER = struct.Struct("<4sIq")  # magic, slots, receipts so far
_SLOT = struct.Struct("<qqq")  # seq, t_ns, total_num_scheduled_tokens
_COUNT = struct.Struct("<q")
SIZE = _HEADER.size + SLOTS * _SLOT.size
RING_ATTR = "_vllm_contract_receipts"  # on a WorkerWrapperBase instance


class Ring:
    """A worker's last SLOTS receipts; written by the worker, read by the engine."""

    def __init__(self, buf: Any, path: Path | None = None) -> None:
        self.buf = buf
        self.path = path
        self.count = 0

    @classmethod
    def in_memory(cls) -> "Ring":
        buf = bytearray(SIZE)
        _HEADER.pack_into(buf, 0, MAGIC, SLOTS, 0)
        return cls(buf)

    @classmethod
    def create(cls, path: Path) -> "Ring":
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            buf = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        _HEADER.pack_into(buf, 0, MAGIC, SLOTS, 0)
        return cls(buf, path)

    @classmethod
    def open(cls, path: Path) -> "Ring | None":
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < SIZE:
                return None
            buf = mmap.mmap(fd, SIZE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        if _HEADER.unpack_from(buf, 0)[0] != MAGIC:
            return None
        return cls(buf, path)

    # worker side, on every step of the worker: two writes into the shared page, nothing more
    def note(self, tokens: int) -> None:
        self.count = n = self.count + 1
        _SLOT.pack_into(self.buf, _HEADER.size + (n % SLOTS) * _SLOT.size, n, now_ns(),
                        tokens)
        _COUNT.pack_into(self.buf, 8, n)

    # engine side
    def received(self) -> int:
        return _COUNT.unpack_from(self.buf, 8)[0]

    def get(self, seq: int) -> tuple[int, int] | None:
        """(t_ns, tokens) of receipt `seq`, or None (not received yet, or overwritten)."""
        s, t_ns, tokens = _SLOT.unpack_from(self.buf, _HEADER.size + (seq % SLOTS) * _SLOT.size)
        return (t_ns, tokens) if s == seq else None


def ring_path(run_dir: Path, pid: int) -> Path:
    return run_dir / f"worker-{pid}.ring"


class Receipts:
    """Engine side: the rings of an executor's workers, and the receipts still owed."""

    RETRY_S = 1.0
    MAX_OWED = 64  # give up on a receipt this many hand-offs old: that worker never got it

    def __init__(self, workers: list[tuple[int, Any]], kind: str) -> None:
        # workers: (rank, Ring) for in-process rings, (rank, pid) for rings in files
        self.kind = kind
        self._rings: dict[int, Ring | None] = {}
        self._pids: dict[int, int] = {}
        for rank, where in workers:
            if isinstance(where, Ring):
                self._rings[rank] = where
            else:
                self._pids[rank] = where
                self._rings[rank] = None
        self._next_try = 0.0
        self._owed: list[tuple[int, int, int]] = []  # (step, seq, rank)
        self._live = [rank for rank, ring in self._rings.items() if ring is not None]
        self._missing = [rank for rank, ring in self._rings.items() if ring is None]

    @property
    def workers(self) -> list[dict]:
        return [{"rank": r, "pid": self._pids.get(r, os.getpid())} for r in sorted(self._rings)]

    def _open_missing(self) -> None:
        now = time.monotonic()
        if now < self._next_try:
            return
        self._next_try = now + self.RETRY_S
        from vllm_contract.recorder.rundir import run_dir

        for rank in list(self._missing):
            ring = Ring.open(ring_path(run_dir(), self._pids[rank]))
            if ring is not None:
                self._rings[rank] = ring
                self._missing.remove(rank)
                self._live.append(rank)

    def collect(self, step: int | None, seq: int | None) -> dict[int, list]:
        """`received` rows per step: for hand-off `seq` (of `step`) and for earlier ones a
        worker had not got yet when their update came (tensor-parallel ranks other than the
        one that answers). step=None: only the earlier ones (at close)."""
        if self._missing:
            self._open_missing()
        owed = self._owed
        if seq is not None:  # owed only by workers whose ring we can read
            owed.extend((step, seq, rank) for rank in self._live)
        if not owed:
            return {}
        counts = {rank: self._rings[rank].received() for rank in self._live}
        out: dict[int, list] = {}
        keep = []
        newest = max(s for _, s, _ in owed)
        for st, sq, rank in owed:
            got = self._rings[rank].get(sq) if counts.get(rank, 0) >= sq else None
            if got is not None:
                out.setdefault(st, []).append(("received", rank, sq, got[0], got[1]))
            elif newest - sq < self.MAX_OWED:
                keep.append((st, sq, rank))
            elif counts.get(rank, 0) == 0 and rank in self._live:
                # This worker never reported a receipt (its plugin is not armed): stop asking.
                self._live.remove(rank)
                log.warning("vllm-contract: worker %d reports no receipts; received rows "
                            "will be missing for it", rank)
        self._owed = keep
        return out


def for_executor(executor: Any) -> Receipts | None:
    """Receipts for the workers of a vLLM executor, or None where we cannot see them."""
    name = type(executor).__name__
    workers = getattr(executor, "workers", None)
    driver = getattr(executor, "driver_worker", None)
    if workers is not None and all(hasattr(w, "proc") for w in workers):  # MultiprocExecutor
        return Receipts([(int(w.rank), int(w.proc.pid)) for w in workers], f"{name}: ring files")
    if driver is not None and not workers:  # UniProcExecutor: the worker lives in this process
        ring = driver.__dict__.get(RING_ATTR)
        if not isinstance(ring, Ring):
            ring = Ring.in_memory()
            driver.__dict__[RING_ATTR] = ring
        return Receipts([(0, ring)], f"{name}: in process")
    return None


# -- worker side ------------------------------------------------------------------------------
_worker_rings_failed = False


def _worker_ring(wrapper: Any) -> Ring | None:
    """The ring of a worker in its own process, created on its first receipt."""
    global _worker_rings_failed
    ring = wrapper.__dict__.get(RING_ATTR)
    if ring is not None or _worker_rings_failed:
        return ring
    try:
        from vllm_contract.recorder.rundir import ensure_run_dir, remove_quietly

        path = ring_path(ensure_run_dir(), os.getpid())
        ring = Ring.create(path)
        import atexit

        atexit.register(remove_quietly, path)
    except Exception as e:
        _worker_rings_failed = True
        log.error("vllm-contract: worker receipts disabled: %s: %s", type(e).__name__, e)
        return None
    wrapper.__dict__[RING_ATTR] = ring
    return ring


def install_worker_hook() -> bool:
    """Class-level: every WorkerWrapperBase notes each execute_model() it gets. Returns whether
    installed (False when vLLM's worker module is not there)."""
    try:
        from vllm.v1.worker.worker_base import WorkerWrapperBase
    except Exception:
        return False
    original = WorkerWrapperBase.execute_model
    if getattr(original, "_vllm_contract", False):
        return True

    def execute_model(self, scheduler_output, *args, **kwargs):
        try:
            ring = _worker_ring(self)
            if ring is not None:
                ring.note(scheduler_output.total_num_scheduled_tokens)
        except Exception as e:  # the worker never pays for our bugs
            global _worker_rings_failed
            if not _worker_rings_failed:
                _worker_rings_failed = True
                log.error("vllm-contract: worker receipts disabled: %s: %s",
                          type(e).__name__, e)
            self.__dict__.pop(RING_ATTR, None)
        return original(self, scheduler_output, *args, **kwargs)

    execute_model._vllm_contract = True
    execute_model.__wrapped__ = original
    execute_model.__doc__ = original.__doc__
    WorkerWrapperBase.execute_model = execute_model
    return True
