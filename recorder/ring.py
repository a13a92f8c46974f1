"""A byte ring in shared memory from the engine process to its writer process.

The engine copies each item into the ring (a memcpy, no system call for the data) and then
writes the ring's new end position, 8 bytes, to a pipe. That write is the commit: a system call
orders the memory writes before it on every CPU. Commits are cumulative positions, so a commit
the full pipe refuses (the reader far behind) is covered by the next one. The ring never blocks
the engine: an item that does not fit is refused.

While the engine is busy the reader does not sleep on the commit pipe: it wakes every POLL_S
and takes what has gathered. A commit then wakes nobody (a wake-up per step is paid by the engine
thread in its commit), and the reader works in batches: on a CPU engine whose model threads
keep both cores' caches full, it spends less CPU per step in a round per POLL_S than in a round
per step (bench/RESULTS.md). What must not wait for the next round (a
flush barrier, the stop, a ring half full) is followed by a byte on a second pipe, which the
reader always listens to; the end of either pipe (the engine closed the ring, or its process
ended) wakes it too. An idle reader sleeps on both.

The reader publishes how far it has consumed in the ring's header, always after a system call
that followed its reads, for the same ordering reason. The header also carries the reader's
answers to the engine: the last barrier done, and whether its writer failed.

Not to be confused with receipts.Ring (a worker's last receipts, overwritten in place): this one
is a queue, and nothing in it is overwritten before it has been read.
"""

from __future__ import annotations

import mmap
import os
import select
import struct

HEADER = 64
POLL_S = 0.25
_U64 = struct.Struct("<Q")
_LEN = struct.Struct("<I")
# Header fields (u64 each), all written by the reader.
READ_POS, ACK, FAILED = 0, 8, 16


class RingWriter:
    """The engine's end."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.fd = os.memfd_create("vllm-contract-ring")
        os.ftruncate(self.fd, HEADER + capacity)
        # Every page allocated and mapped now: first touches in the running engine were page
        # faults, paid in its steps until the ring had gone round once.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self.mm = mmap.mmap(self.fd, HEADER + capacity, flags=flags)
        self.commit_r, self.commit_w = os.pipe()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.commit_w, False)
        os.set_blocking(self.wake_w, False)
        self.pos = 0
        self.closed_commits = False
        self._woken_at = -1  # the reader's position when it was last woken for room

    def header(self, field: int) -> int:
        return _U64.unpack_from(self.mm, field)[0]

    def free(self) -> int:
        return self.capacity - (self.pos - self.header(READ_POS))

    def put(self, data: bytes, commit: bool = True) -> bool:
        """Copy one item in and (by default) commit it; False (nothing written) if it does not
        fit or the commits have ended. BrokenPipeError when the reader is gone. An item put
        without a commit goes with the next commit: a step's schedule goes with its update."""
        if self.closed_commits:
            return False
        need = _LEN.size + len(data)
        free = self.free()
        if need > free:
            return False
        self._copy(self.pos, _LEN.pack(len(data)))
        self._copy(self.pos + _LEN.size, data)
        self.pos += need
        if commit:
            self.commit()
            # half full: the reader comes now rather than at its next round (once per round,
            # a round being known by how far the reader had read)
            if free - need < self.capacity // 2:
                read_pos = self.header(READ_POS)
                if self._woken_at != read_pos:
                    self._woken_at = read_pos
                    self.wake()
        return True

    def commit(self) -> None:
        try:
            os.write(self.commit_w, _U64.pack(self.pos))
        except BlockingIOError:
            pass  # the pipe holds 8k commits the reader has not read: a later one covers this

    def wake(self) -> None:
        """Have the reader take what is committed now, not at its next round."""
        try:
            os.write(self.wake_w, b"!")
        except OSError:  # full: a wake-up is pending already; broken: the next commit says so
            pass

    def _copy(self, pos: int, data: bytes) -> None:
        cap, mm = self.capacity, self.mm
        off = pos % cap
        end = off + len(data)
        if end <= cap:
            mm[HEADER + off:HEADER + end] = data
        else:
            k = cap - off
            view = memoryview(data)
            mm[HEADER + off:HEADER + cap] = view[:k]
            mm[HEADER:HEADER + end - cap] = view[k:]

    def close_commits(self) -> None:
        """The reader sees the end of the pipe after the last commit."""
        if not self.closed_commits:
            self.closed_commits = True
            os.close(self.commit_w)
            os.close(self.wake_w)

    def close_reader_end(self) -> None:
        if self.commit_r >= 0:
            os.close(self.commit_r)
            os.close(self.wake_r)
            # never closed twice: the numbers may belong to other files by then
            self.commit_r = self.wake_r = -1

    def close(self) -> None:
        self.close_reader_end()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass


class RingReader:
    """The writer process's end."""

    def __init__(self, fd: int, commit_fd: int, wake_fd: int, capacity: int) -> None:
        self.capacity = capacity
        self.mm = mmap.mmap(fd, HEADER + capacity)
        self.commit_fd = commit_fd
        self.wake_fd = wake_fd
        os.set_blocking(commit_fd, False)
        os.set_blocking(wake_fd, False)
        # poll, not select: the descriptors keep the engine process's numbers, which may be
        # above select()'s limit of 1024 in a busy server
        self._busy = select.poll()
        self._busy.register(wake_fd, select.POLLIN)
        self._idle = select.poll()
        self._idle.register(wake_fd, select.POLLIN)
        self._idle.register(commit_fd, select.POLLIN)
        self.committed = 0
        self.consumed = 0
        self._released = 0

    def wait(self, busy: bool) -> bool:
        """Busy: sleep POLL_S or until woken; idle: until anything is committed. Then take the
        commits; False at the end of the pipe (the engine closed it, or its process ended).
        Then publish what earlier rounds consumed: these system calls order those reads
        before the publication."""
        if busy:
            self._busy.poll(POLL_S * 1000)
        else:
            self._idle.poll()
        try:
            os.read(self.wake_fd, 1 << 10)
        except BlockingIOError:
            pass
        end = False
        while True:  # every commit (the pipe holds 8k of them; one read takes them all)
            try:
                data = os.read(self.commit_fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                end = True
                break
            self.committed = max(self.committed, _U64.unpack_from(data, len(data) - 8)[0])
            if len(data) < 1 << 16:
                break
        self.release()
        return not end

    def pending(self) -> bool:
        """Committed items not yet read."""
        return self.consumed < self.committed

    def release(self) -> None:
        if self._released != self.consumed:
            _U64.pack_into(self.mm, READ_POS, self.consumed)
            self._released = self.consumed

    def items(self):
        """The committed items not yet read, as bytes."""
        while self.consumed < self.committed:
            n = _LEN.unpack(self._read(self.consumed, _LEN.size))[0]
            data = self._read(self.consumed + _LEN.size, n)
            self.consumed += _LEN.size + n
            yield data

    def _read(self, pos: int, n: int) -> bytes:
        cap, mm = self.capacity, self.mm
        off = pos % cap
        end = off + n
        if end <= cap:
            return mm[HEADER + off:HEADER + end]
        return mm[HEADER + off:HEADER + cap] + mm[HEADER:HEADER + end - cap]

    def set(self, field: int, value: int) -> None:
        _U64.pack_into(self.mm, field, value)
