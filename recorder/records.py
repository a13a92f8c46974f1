"""The items on the writers' queues, one record per kind: the writer thread's deque
(writer.py) and the ring to the writer process (writer_proc.py) carry the same records, read by
field name on both sides.

NamedTuples: one is built per hook call on the engine's hot path, about as cheaply as a slots
dataclass, and being a tuple it goes on the ring as one (handoff.encode_record: its kind's
number, then its fields) with no pickle reduction per item (bench/RESULTS.md). A record's type
is its kind: consumers dispatch on `type(item) is Schedule`.

Where a field's value differs between the two queues, it says so: the engine side of a writer
process sends the vLLM objects themselves (pickled by handoff.py), the writer thread takes
snapshot.py's snapshots of them.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Schedule(NamedTuple):
    """One schedule() call. `out`: snapshot.Scheduled on the thread's queue, the SchedulerOutput
    on the ring. `cost`: estimated bytes it keeps queued, for the pending budget (thread only)."""
    step: int
    t_ns: int
    dur_ns: int
    state: tuple  # (running, waiting, KV cache usage) after schedule()
    out: Any
    cost: int = 0


class Malformed(NamedTuple):
    """A SchedulerOutput no snapshot could be made of: kept whole, in its plain form."""
    step: int
    t_ns: int | None
    stage: str
    error: str
    value: Any


class Update(NamedTuple):
    """One update_from_output() call. `model_output`: snapshot.model_output()'s dict on the
    thread's queue, the ModelRunnerOutput's handoff bytes (taken before the call) on the ring."""
    step: int
    t_ns: int
    dur_ns: int
    model_output: Any
    finishes: Any  # [(req_id, reason name)] or ()
    transport: Any  # the step's transport rows or ()


class Finish(NamedTuple):
    """finish_requests() (or another source) finished requests between steps."""
    step: int
    t_ns: int
    source: str
    finishes: list


class Input(NamedTuple):
    """A call that fed the scheduler besides a step's schedule() and update: add_request(),
    finish_requests(), a draft update, schedule()'s arguments (input_log.py). `step`: the last
    step scheduled before it; `updates`: update_from_output() calls before it; `seq`: its
    place among all the recorded calls. `payload`, by call: add_request, input_log.
    request_fields()'s tuple; finish_requests, (ids given or None, status name, ids it
    finished in vLLM's order); drafts, (req_ids, drafts, the step whose output they went into
    or None); schedule, (args, kwargs)."""
    step: int
    seq: int
    updates: int
    t_ns: int
    call: str
    payload: Any


class Transport(NamedTuple):
    """Transport rows of a step, written apart from its update (a lagging worker, or close)."""
    step: int
    rows: list


class Manifest(NamedTuple):
    """Keys to merge into the manifest."""
    values: dict


class Error(NamedTuple):
    """The engine side failed: recording stops, and the manifest says why."""
    error: str
    when: float


class Drop(NamedTuple):
    """A step the writer had no room for: a gap in the trace."""
    step: int


class Barrier(NamedTuple):
    """Thread queue: set `done` (a threading.Event) once everything before it is written."""
    done: Any


class Stop(NamedTuple):
    """Write what is queued and seal the trace."""


# Ring only: the writer process's start, its flushes and the drops told in bulk.
class Init(NamedTuple):
    """The first item on the ring: where and how the child's TraceWriter writes."""
    engine_dir: str
    manifest: dict
    options: dict
    fields: dict  # snapshot.Fields.to_dict()


class Flush(NamedTuple):
    """Write everything before it, then acknowledge `seq` in the ring's header."""
    seq: int


class Dropped(NamedTuple):
    """Steps the ring had no room for."""
    steps: list


STOP = Stop()

# What crosses the ring; a record's place here is its kind's number there (handoff.py).
RING_RECORDS = (Schedule, Malformed, Update, Finish, Transport, Manifest, Error, Stop, Init,
                Flush, Dropped, Input)
