"""Disk space held back so that a recorder that fills its disk can still say so.

A flush that hits a full disk stops the recording; the manifest must then record why and where,
and rewriting it needs room for a second copy (it is replaced atomically). The reserve is a
file of RESERVE_BYTES allocated before any data, and deleted just before that last rewrite."""

from __future__ import annotations

import os
from pathlib import Path

RESERVE_BYTES = 64 << 10
NAME = ".reserve"  # a dot file: readers skip it


class Reserve:
    def __init__(self, engine_dir: Path, size: int = RESERVE_BYTES) -> None:
        """Raises OSError (ENOSPC) when the disk cannot hold even the reserve."""
        self.path = Path(engine_dir) / NAME
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except (AttributeError, OSError) as e:
                if getattr(e, "errno", None) not in (None, 95):  # 95: not supported here
                    raise
                os.write(fd, bytes(size))  # no fallocate (some filesystems): blocks in full
        except OSError:
            os.close(fd)
            self.release()
            raise
        os.close(fd)

    def release(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
