"""The clock of every `t_ns` column: nanoseconds since the epoch, read from the monotonic clock
and set to the wall clock once, when this module loads.

The checks order one engine's calls by these times (finished.leaked, computed.progress: with
batches in flight, step numbers do not give the order), so a time must never run backwards. The
wall clock can: NTP steps it, a VM resumes with it set back. The monotonic clock never does, and
it is system-wide, so times taken in the engine's and its workers' processes compare too (each
process sets it once: a step of the wall clock between two of those moments shows as an offset
between their times). The cost: after a step of the wall clock, these times differ from it by
that step; a slewing NTP moves them apart by parts per million.
"""

from __future__ import annotations

import time

_OFFSET = time.time_ns() - time.monotonic_ns()


def now_ns() -> int:
    return time.monotonic_ns() + _OFFSET
