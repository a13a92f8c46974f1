"""The scheduler's inputs as today's trace lets them be derived (vLLM-free).

A trace records what the scheduler emitted and the model outputs it was given, not the calls
that fed it. What a re-run needs is derived: the order of schedule(), update_from_output() and
finish_requests() from the recorder's clock (one monotonic clock, each call stamped when it
returned, so sorting by it is the order the calls were made in); each request's arrival as just
before the schedule() that first names it; aborts from `finish_events`; drafts from the spec
tokens a later step schedules; model outputs by each request's output position.

The recording stays in Arrow columns and is turned into Python objects a window of steps at a
time as the re-run reaches it, so that a re-run's memory does not grow with the trace's length
in Python objects (several KB a step) but only in its columns.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vllm_contract.errors import TraceError
from vllm_contract.manifest import mid_stream_note
from vllm_contract.replay.resim import log
from vllm_contract.replay.worker import canonical
from vllm_contract.replay.worker.plan import most_in_flight, step_ranges

DERIVED = ("inputs derived from the recorded outputs (the trace has no input log yet): "
           "arrival at the first step that schedules a request; aborts from finish_events, "
           "one id per finish_requests() call in the recorded order; a request aborted before "
           "it was ever scheduled is made up (one prompt token); drafts from the spec tokens "
           "a request is next scheduled with; model outputs from model_outputs by each "
           "request's output position")

# the tables canonical.from_trace reads
_CANONICAL = ("steps", "scheduled", "requests", "finished", "preempted", "freed_mm",
              "extra_fields")
WINDOW = 256  # steps turned into canonical form at a time
_BATCH = 65_536  # rows turned into Python objects at a time


@dataclass(frozen=True)
class Call:
    # "schedule", "update", "abort"; from an input log also "add", "drafts", "drafts_in_output"
    kind: str
    step: int
    req_id: str | None = None
    status: str | None = None  # abort: the RequestStatus name recorded
    data: Any = None  # add: the `added` row's seq; drafts: (req_ids, lists, step or None)


def _by_step(table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """The rows with a step, stably sorted by it (each step's rows keep their stored order),
    and the step column as an array to bisect."""
    if table["step"].null_count:
        table = table.filter(pc.is_valid(table["step"]))
    steps = table["step"].to_numpy()
    if len(steps) > 1 and not (np.diff(steps) >= 0).all():  # as written, mostly: no copy then
        table = table.take(pc.sort_indices(table, [("step", "ascending")]))
        steps = table["step"].to_numpy()
    return table, steps


def _window(table: pa.Table, steps: np.ndarray, lo: int, hi: int) -> pa.Table:
    a, b = np.searchsorted(steps, [lo, hi])
    return table.slice(int(a), int(b - a))


def _rows(table: pa.Table) -> Iterator[dict]:
    for batch in table.to_batches(max_chunksize=_BATCH):
        yield from batch.to_pylist()


class _Window:
    """An engine trace seen through steps lo..hi-1, for canonical.from_trace."""

    def __init__(self, streams: dict, lo: int, hi: int) -> None:
        self.streams, self.lo, self.hi = streams, lo, hi

    def read(self, table: str, columns: list[str] | None = None) -> pa.Table:
        t = self.streams[table].window(self.lo, self.hi)
        return t if columns is None else t.select(columns)


def _parts(engine, table: str) -> Iterator[pa.Table]:
    """A table's rows a part at a time in stored order: a stream segment whole (at most the
    recorder's segment size), a Parquet segment a row group at a time once its pages pass
    their checksums (one that fails is read whole, as the reader notes it)."""
    import pyarrow.parquet as pq

    from vllm_contract import schema

    for path in engine.segments(table):
        if path.suffix == schema.PARQUET_SUFFIX and engine.verify(path):
            f = pq.ParquetFile(path)
            for i in range(f.num_row_groups):
                yield f.read_row_group(i)
            continue
        part = engine.segment(path)
        if part is not None:
            yield part


class _Stream:
    """One table's rows for steps lo..hi-1, read forward a part at a time and let go of once
    the run has passed them: memory is a few parts, not the table. Rows are written in step
    order but for those an update writes (a later flush, with batches in flight), so parts are
    read until one starts at least a window past the rows asked for. Asked for an earlier
    window (a what-if run's recorded side, a break hook's look back), it reads from the start
    again."""

    def __init__(self, engine, table: str) -> None:
        self.engine, self.table = engine, table
        self._restart()

    def _restart(self) -> None:
        self._parts = _parts(self.engine, self.table)
        self._held: list[tuple[pa.Table, np.ndarray]] = []  # each sorted by step, its steps
        self._last_start: int | None = None  # the first step of the part read last
        self._done = False
        self._lo = None

    def _more(self, until: int) -> None:
        while not self._done and (self._last_start is None or self._last_start < until):
            part = next(self._parts, None)
            if part is None:
                self._done = True
                break
            if part.num_rows:
                part, steps = _by_step(part)
                if len(steps):
                    self._held.append((part, steps))
                    self._last_start = int(steps[0])

    def window(self, lo: int, hi: int) -> pa.Table:
        if self._lo is not None and lo < self._lo:
            self._restart()
        self._lo = lo
        self._more(hi + WINDOW)
        # what the run has passed is let go (a whole part: a slice would keep its buffers)
        self._held = [(t, st) for t, st in self._held if st[-1] >= lo]
        slices = [_window(t, st, lo, hi) for t, st in self._held]
        slices = [x for x in slices if x.num_rows]
        if not slices:
            return schema_empty(self.table)
        if len(slices) == 1:
            return slices[0]
        t = pa.concat_tables(slices)
        return t.take(pc.sort_indices(t, [("step", "ascending")]))


def schema_empty(table: str) -> pa.Table:
    from vllm_contract import schema

    return schema.empty(schema.schema(table))


class Plains:
    """The recording's canonical SchedulerOutput of each step, a mapping from step: built a
    window of steps at a time when a step of it is asked for, from the tables read forward
    (_Stream), the window before dropped."""

    def __init__(self, engine, first: int, count: int) -> None:
        self.first, self.count = first, count
        self._streams = {t: _Stream(engine, t) for t in _CANONICAL}
        self._lo: int | None = None
        self._window: dict[int, dict] = {}

    def __len__(self) -> int:
        return self.count

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.first <= step < self.first + self.count

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.first + self.count))

    def __getitem__(self, step: int) -> dict:
        if step not in self:
            raise KeyError(step)
        lo = self.first + (step - self.first) // WINDOW * WINDOW
        if lo != self._lo:
            self._window = {}  # the steps before are compared: let them go first
            self._window = dict(canonical.from_trace(_Window(self._streams, lo, lo + WINDOW)))
            self._lo = lo
        return self._window[step]

    def get(self, step: int, default: dict | None = None) -> dict | None:
        return self[step] if step in self else default

    def items(self) -> Iterator[tuple[int, dict]]:
        for step in self:
            yield step, self[step]


class ByStep:
    """The tokens each (step, req_id) model output row gave, looked up in the rows (sorted by
    step, then position) rather than kept as Python objects: read only for requests the
    scheduler no longer holds, and by a what-if run's recorded side."""

    def __init__(self, table: pa.Table) -> None:
        self.table, self.steps = table, table["step"].to_numpy()

    def get(self, key: tuple[int, str], default: list[int] | None = None) -> list[int] | None:
        step, rid = key
        rows = _window(self.table, self.steps, step, step + 1)
        found = default
        for r, toks in zip(rows["req_id"].to_pylist(), rows["sampled_token_ids"].to_pylist()):
            if r == rid:  # the last row wins, as a dict built from them would have it
                found = list(toks or [])
        return found

    def items(self) -> Iterator[tuple[tuple[int, str], list[int]]]:
        step, seen = None, {}
        for r in _rows(self.table.select(["step", "req_id", "sampled_token_ids"])):
            if r["step"] != step:
                yield from seen.items()
                step, seen = r["step"], {}
            seen[(step, r["req_id"])] = list(r["sampled_token_ids"] or [])
        yield from seen.items()


@dataclass
class Outputs:
    """The model's side of the recording: per request incarnation (req_id, n-th introduction),
    the whole token stream, and the token list recorded at the output positions where one row
    gave several (a row of one token is the stream's token there); per (step, req_id), the
    tokens that step gave it (for requests the scheduler no longer holds)."""
    rows: dict[tuple[str, int], dict[int, list[int]]] = field(default_factory=dict)
    streams: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    by_step: ByStep | dict = field(default_factory=dict)

    def at(self, key: tuple[str, int], position: int) -> list[int] | None:
        row = self.rows.get(key, {}).get(position)
        if row is not None:
            return list(row)
        tail = self.streams.get(key, [])[position:position + 1]
        return tail or None


class Calls:
    """The calls in their recorded order, made one at a time from sorted columns: kind 0 a
    schedule(), 1 an update, k >= 2 the (k-2)-th of `others` (aborts, or an input log's
    calls)."""

    def __init__(self, kinds: np.ndarray, steps: np.ndarray, others: list[Call]) -> None:
        self.kinds, self.steps, self.others = kinds, steps, others

    def __len__(self) -> int:
        return len(self.kinds)

    def __iter__(self) -> Iterator[Call]:
        for kind, step in zip(self.kinds.tolist(), self.steps.tolist()):
            if kind == 0:
                yield Call("schedule", step)
            elif kind == 1:
                yield Call("update", step)
            else:
                yield self.others[kind - 2]


@dataclass
class Inputs:
    calls: Calls
    plains: Plains  # step -> canonical SchedulerOutput of the recording
    outputs: Outputs
    finishes: dict[int, list[tuple[str, str]]]  # step -> its update's finishes, sorted
    engine: Any  # the recording (an EngineTrace): derived drafts read its scheduled rows
    in_flight: int
    structured: bool  # a request uses structured output: the tokenizer is needed
    intro: dict[str, list[int]] = field(default_factory=dict)  # req_id -> steps it is new at
    _spec: dict[str, tuple[list[int], list[list[int]]]] | None = None
    added: Any = None  # an input log's add_request() rows (log.Added); None: derived inputs
    schedule_args: dict[int, tuple[list, dict]] = field(default_factory=dict)  # from step on

    @property
    def logged(self) -> bool:
        return self.added is not None

    @property
    def spec(self) -> dict[str, tuple[list[int], list[list[int]]]]:
        """req_id -> (the steps that schedule it, its spec tokens there); built when first
        asked for (a run that gives drafts back)."""
        if self._spec is None:
            self._spec = _spec(_scheduled(self.engine))
        return self._spec

    def next_drafts(self, req_id: str, step: int) -> list[int]:
        """The spec tokens the recording next schedules req_id with after `step`."""
        steps, tokens = self.spec.get(req_id, ([], []))
        i = bisect.bisect_right(steps, step)
        return list(tokens[i]) if i < len(steps) else []


def refuse_unusable(engine) -> None:
    """TraceError for a trace whose inputs cannot be derived at all."""
    m = engine.manifest
    note = mid_stream_note(m)
    if note:
        raise TraceError(f"resim needs the recording from the engine's start: {note}")
    dropped = [s for a, b in m.get("dropped_steps") or () for s in range(a, b + 1)]
    if dropped:
        raise TraceError(f"steps {step_ranges(dropped)} are absent from the trace (dropped "
                         "while recording): a re-run cannot skip the scheduler's work there")
    bad = sorted({r["step"] for r in engine.read("malformed_steps", ["step"]).to_pylist()})
    if bad:
        raise TraceError(f"steps {step_ranges(bad)} were quarantined as malformed: resim "
                         "cannot feed them")


def _calls(engine, known: pa.Array, logged: list | None = None) -> Calls:
    """The recorded order of schedule() and update calls (by the recorder's clock) with the
    aborts among them; `logged`: an input log's entries (log.py), placed by their counts of
    the calls before them instead, and no abort derived."""
    sched = engine.read("steps", ["step", "t_ns"])
    upd = engine.read("updates", ["step", "t_ns"])
    upd = upd.filter(pc.fill_null(pc.is_in(upd["step"], value_set=known), False))
    if logged is not None:
        return _with_log(sched, upd, logged)
    fin = engine.read("finish_events")
    fin = fin.filter(pc.fill_null(pc.not_equal(fin["source"], "update_from_output"), True))
    n = (sched.num_rows, upd.num_rows, fin.num_rows)
    t = np.concatenate([pc.fill_null(x["t_ns"], 0).to_numpy().astype(np.int64)
                        for x in (sched, upd, fin)])
    kinds = np.concatenate([np.zeros(n[0], np.int64), np.ones(n[1], np.int64),
                            np.arange(2, 2 + n[2], dtype=np.int64)])
    prio = np.minimum(kinds, 2)
    steps = np.concatenate([pc.fill_null(x["step"], -1).to_numpy().astype(np.int64)
                            for x in (sched, upd, fin)])
    order = np.lexsort((np.arange(len(t)), prio, t))  # the recorded order, ties as stored
    aborts = [Call("abort", s, rid, reason) for s, rid, reason in zip(
        steps[n[0] + n[1]:].tolist(), fin["req_id"].to_pylist(), fin["reason"].to_pylist())]
    return Calls(kinds[order], steps[order], aborts)


def _with_log(sched: pa.Table, upd: pa.Table, logged: list) -> Calls:
    """schedule() and update calls in the clock's order, each logged input put where its
    counts say: after the schedule() of its step and its `updates`-th update."""
    n = (sched.num_rows, upd.num_rows)
    t = np.concatenate([pc.fill_null(x["t_ns"], 0).to_numpy().astype(np.int64)
                        for x in (sched, upd)])
    base_kinds = np.concatenate([np.zeros(n[0], np.int64), np.ones(n[1], np.int64)])
    base_steps = np.concatenate([pc.fill_null(x["step"], -1).to_numpy().astype(np.int64)
                                 for x in (sched, upd)])
    order = np.lexsort((np.arange(len(t)), base_kinds, t))
    base_kinds, base_steps = base_kinds[order].tolist(), base_steps[order].tolist()
    first = min(base_steps) if base_steps else 0
    kinds, steps = [], []
    scheduled = updated = 0  # calls made so far
    i = 0
    for kind, step in zip(base_kinds + [None], base_steps + [None]):
        # the inputs whose place is here: every schedule() and update before them made
        while i < len(logged) and (logged[i].step - first + 1 <= scheduled
                                   and logged[i].updates <= updated):
            kinds.append(2 + i)
            steps.append(logged[i].step)
            i += 1
        if kind is None:
            break
        kinds.append(kind)
        steps.append(step)
        scheduled += kind == 0
        updated += kind == 1
    for j in range(i, len(logged)):  # after the last recorded call (a trace cut short)
        kinds.append(2 + j)
        steps.append(logged[j].step)
    return Calls(np.array(kinds, np.int64), np.array(steps, np.int64),
                 [e.call for e in logged])


def _outputs(engine, intro: dict[str, list[int]]) -> Outputs:
    out = Outputs()
    rows = engine.read("model_outputs", ["step", "req_id", "pos", "sampled_token_ids"])
    rows = rows.filter(pc.is_valid(rows["step"]))
    rows = rows.take(pc.sort_indices(rows, [("step", "ascending"), ("pos", "ascending")]))
    out.by_step = ByStep(rows.select(["step", "req_id", "sampled_token_ids"]))
    for r in _rows(rows):
        rid, step, toks = r["req_id"], r["step"], r["sampled_token_ids"]
        k = bisect.bisect_right(intro.get(rid, []), step) - 1
        if k < 0 or not toks:
            continue
        stream = out.streams.setdefault((rid, k), [])
        if len(toks) != 1:
            out.rows.setdefault((rid, k), {})[len(stream)] = toks
        stream.extend(toks)
    return out


def _scheduled(engine) -> pa.Table:
    """The scheduled rows' columns the derived drafts read, in step order (read when a run
    gives drafts back from a trace without an input log)."""
    table, _ = _by_step(engine.read("scheduled", ["step", "req_id", "num_scheduled_tokens",
                                                  "spec_token_ids"]))
    return table


def _intro(engine) -> dict[str, list[int]]:
    """req_id -> the steps that introduce it (scheduled as new), read a part at a time."""
    news = []
    for part in _parts(engine, "scheduled"):
        part = part.select(["step", "req_id", "kind", "pos"])
        news.append(part.filter(pc.fill_null(pc.equal(part["kind"], "new"), False)))
    if not news:
        return defaultdict(list)
    new = pa.concat_tables(news)
    new = new.take(pc.sort_indices(new, [("step", "ascending"), ("pos", "ascending")]))
    intro: dict[str, list[int]] = defaultdict(list)
    for rid, s in zip(new["req_id"].to_pylist(), new["step"].to_pylist()):
        intro[rid].append(s)
    return intro


def _spec(scheduled: pa.Table) -> dict[str, tuple[list[int], list[list[int]]]]:
    spec: dict[str, tuple[list[int], list[list[int]]]] = {}
    t = scheduled.filter(pc.is_valid(scheduled["num_scheduled_tokens"]))
    t = t.select(["step", "req_id", "spec_token_ids"])
    for r in _rows(t):
        at, toks = spec.setdefault(r["req_id"], ([], []))
        drafts = list(r["spec_token_ids"] or [])
        if at and at[-1] == r["step"]:  # a second row in one step: the last one's
            toks[-1] = drafts if r["spec_token_ids"] is not None else toks[-1]
            continue
        at.append(r["step"])
        toks.append(drafts)
    return spec


def _structured(engine) -> bool:
    for r in engine.read("requests", ["sampling_params"]).to_pylist():
        sp = json.loads(r["sampling_params"]) if r["sampling_params"] else None
        if isinstance(sp, dict) and sp.get("structured_outputs") is not None:
            return True
    return False


def derive(engine) -> Inputs:
    refuse_unusable(engine)
    known = pc.unique(engine.read("steps", ["step"])["step"]).drop_null()
    steps = sorted(known.to_pylist())
    if not steps:
        raise TraceError(f"engine {engine.name} has no recorded steps to re-run")
    if steps != list(range(steps[0], steps[0] + len(steps))):
        gaps = sorted(set(range(steps[0], steps[-1] + 1)) - set(steps))
        raise TraceError(f"steps {step_ranges(gaps)} are absent from the trace: a re-run "
                         "cannot skip them")
    plains = Plains(engine, steps[0], len(steps))
    intro = _intro(engine)
    finishes: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for r in engine.read("finish_events", ["step", "req_id", "reason", "source"]).to_pylist():
        if r["source"] == "update_from_output":
            finishes[r["step"]].append((r["req_id"], r["reason"]))
    entries, added, args = log.read(engine, Call) if log.has_log(engine) else (None, None, {})
    # a request's n-th incarnation: its n-th introduction, or with a log its n-th add (one
    # aborted before it was scheduled is added, and counted, but never introduced)
    incarnations = intro if added is None else added.incarnations()
    return Inputs(_calls(engine, known, entries), plains,
                  _outputs(engine, incarnations), {s: sorted(v) for s, v in finishes.items()},
                  engine, most_in_flight(engine), _structured(engine), intro,
                  added=added, schedule_args=args)
