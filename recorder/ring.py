"""A byte ring in shared memory from the engine process to its writer process.

The engine copies each item into the ring (a memcpy, no system call for the data) and then
writes the ring's new end position, 8 bytes, to a pipe. That write is the commit: a system call
orders the memory writes before it on every CPU, and the reader sleeps on the pipe when idle.
Commits are cumulative positions, so a commit the full pipe refuses (the reader far behind) is
covered by the next one. The ring never blocks the engine: an item that does not fit is refused.

The reader publishes how far it has consumed in the ring's header, always after a system call
that followed its reads, for the same ordering reason. The header also carries the reader's
answers to the engine: the last barrier done, and whether its writer failed.

Not to be confused with receipts.Ring (a worker's last receipts, overwritten in place): this one
is a queue, and nothing in it is overwritten before it has been read.
"""

from __future__ import annotations

import mmap
import os
import struct

HEADER = 64
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
        # faults, 15–30 µs per step until the ring had gone round once.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self.mm = mmap.mmap(self.fd, HEADER + capacity, flags=flags)
        self.commit_r, self.commit_w = os.pipe()
        os.set_blocking(self.commit_w, False)
        self.pos = 0
        self.closed_commits = False

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
        if need > self.free():
            return False
        self._copy(self.pos, _LEN.pack(len(data)))
        self._copy(self.pos + _LEN.size, data)
        self.pos += need
        if commit:
            self.commit()
        return True

    def commit(self) -> None:
        try:
            os.write(self.commit_w, _U64.pack(self.pos))
        except BlockingIOError:
            pass  # the pipe holds 8k commits the reader has not read: a later one covers this

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

    def close_reader_end(self) -> None:
        if self.commit_r >= 0:
            os.close(self.commit_r)
            self.commit_r = -1  # never closed twice: the number may belong to another file

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

    def __init__(self, fd: int, commit_fd: int, capacity: int) -> None:
        self.capacity = capacity
        self.mm = mmap.mmap(fd, HEADER + capacity)
        self.commit_fd = commit_fd
        self.committed = 0
        self.consumed = 0
        self._released = 0

    def wait(self) -> bool:
        """Block until commits arrive; False at the end of the pipe (the engine closed it, or
        its process ended). Then publishes what earlier rounds consumed: this read was the
        system call that orders those reads before the publication."""
        data = os.read(self.commit_fd, 1 << 16)
        if data:
            self.committed = max(self.committed, _U64.unpack_from(data, len(data) - 8)[0])
        self.release()
        return bool(data)

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
