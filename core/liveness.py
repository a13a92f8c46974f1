"""Whether a trace's recorder is still writing it: a lock its writer holds while it records.

A manifest that is not `closed_cleanly` means either a recording in progress or a recorder that
died; a reader must tell them apart (a live trace is normal, and its newest streams are
legitimately empty or mid-batch). The writer holds an exclusive `flock` on a dot file in the
engine directory from its first write to its last; the kernel drops the lock when the process
dies, however it dies, so a reader that can take the lock knows the writer is gone. A trace
without the file (closed, written before this existed, or a copy from elsewhere) cannot tell.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

NAME = ".writer.lock"  # a dot file: readers of tables skip it


def hold(engine_dir: Path) -> int | None:
    """The writer's side: the lock's descriptor, or None when it cannot be had (the recording
    goes on without it: liveness is a reader's convenience, never worth a failed recording)."""
    try:
        fd = os.open(Path(engine_dir) / NAME, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def release(fd: int | None, engine_dir: Path) -> None:
    """The writer's side, once the manifest says how the recording ended."""
    if fd is None:
        return
    try:
        os.unlink(Path(engine_dir) / NAME)
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass


def alive(engine_dir: Path) -> bool | None:
    """True: a writer holds the lock; False: the file is there and nobody holds it (the writer
    died); None: no lock file to ask."""
    path = Path(engine_dir) / NAME
    try:
        # never block on what a hostile trace may put there (a pipe, a device)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
