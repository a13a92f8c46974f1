"""The scheduler's calls for a re-run, in their recorded order (vLLM-free).

A trace of format 3 has an input log (log.py): its add_request(), abort and draft calls are
placed among the schedule() and update calls. An older trace records what the scheduler
emitted and the model outputs it was given, not the calls that fed it, and the rest is
derived: the order of schedule(), update_from_output() and finish_requests() from the
recorder's clock (one monotonic clock, each call stamped when it returned, so sorting by it is
the order the calls were made in); each request's arrival as just before the schedule() that
first names it; aborts from `finish_events`; drafts from the spec tokens a later step
schedules. Either way, model outputs are given by each request's output position.

The recording is read forward, a segment at a time, as the re-run
reaches its steps, and let go of once passed: a re-run's memory does not grow with the
trace's length in its step tables or its model outputs.
"""

from __future__ import annotations

import bisect
import json
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vllm_contract import schema
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
        # a segment at a time (compacted or not), at most the recorder's segment size each
        self._parts = self.engine.parts(self.table)
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
            return schema.empty(schema.schema(self.table))
        if len(slices) == 1:
            return slices[0]
        t = pa.concat_tables(slices)
        return t.take(pc.sort_indices(t, [("step", "ascending")]))


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
    """The tokens each (step, req_id) model output row gave: read only for requests the
    scheduler no longer holds (from the parts the Outputs hold), and, all of them, by a
    what-if run's recorded side (a scan of its own)."""

    def __init__(self, outputs: "Outputs") -> None:
        self.outputs = outputs

    def get(self, key: tuple[int, str], default: list[int] | None = None) -> list[int] | None:
        step, rid = key
        found = default
        for table, steps in self.outputs.parts_at(step):
            rows = _window(table, steps, step, step + 1)
            for r, toks in zip(rows["req_id"].to_pylist(),
                               rows["sampled_token_ids"].to_pylist()):
                if r == rid:  # the last row wins, as a dict built from them would have it
                    found = list(toks or [])
        return found

    def items(self) -> Iterator[tuple[tuple[int, str], list[int]]]:
        for part in self.outputs.sorted_parts():
            step, seen = None, {}
            for r in _rows(part.select(["step", "req_id", "sampled_token_ids"])):
                if r["step"] != step:
                    yield from seen.items()
                    step, seen = r["step"], {}
                seen[(step, r["req_id"])] = list(r["sampled_token_ids"] or [])
            yield from seen.items()


class Outputs:
    """The model's side of the recording, read forward a part at a time as the re-run asks:
    per request incarnation (req_id, n-th introduction or add), its token stream, and the
    token list recorded at the output positions where one row gave several (a row of one token
    is the stream's token there); per (step, req_id), the tokens that step gave it (for
    requests the scheduler no longer holds). A position not read yet reads on until it is
    there (a re-run that schedules a request sooner than the recording did); an incarnation
    the re-run has let go of is dropped (`release`). `load_all()` reads everything (a what-if
    run, which may ask for any request's whole stream at any step)."""

    def __init__(self, engine=None, incarnations: dict[str, list[int]] | None = None) -> None:
        self.rows: dict[tuple[str, int], dict[int, list[int]]] = {}
        self.streams: dict[tuple[str, int], array] = {}
        self.by_step = ByStep(self)
        self._engine, self._inc = engine, incarnations or {}
        self._parts = None if engine is None else engine.parts("model_outputs")
        self._held: list[tuple[pa.Table, np.ndarray]] = []  # for by_step, sorted by step
        self._loaded_to: int | None = None  # the last step read
        self._released: set[tuple[str, int]] = set()

    def _sorted(self, part: pa.Table) -> pa.Table:
        """A part's rows by step, then position: as written, mostly (then not copied)."""
        part = part.select(["step", "req_id", "pos", "sampled_token_ids"])
        if part["step"].null_count or part["pos"].null_count:
            part = part.filter(pc.and_(pc.is_valid(part["step"]), pc.is_valid(part["pos"])))
        st, ps = part["step"].to_numpy(), part["pos"].to_numpy()
        ds, dp = np.diff(st), np.diff(ps)
        if ((ds > 0) | ((ds == 0) & (dp > 0))).all():
            return part
        return part.take(pc.sort_indices(part, [("step", "ascending"), ("pos", "ascending")]))

    def sorted_parts(self) -> Iterator[pa.Table]:
        if self._engine is not None:
            for part in self._engine.parts("model_outputs"):
                yield self._sorted(part)

    def _advance(self) -> bool:
        """Read the next part; False at the end."""
        part = None if self._parts is None else next(self._parts, None)
        if part is None:
            self._parts = None
            return False
        part = self._sorted(part)
        if not part.num_rows:
            return True
        steps = part["step"].to_numpy()
        self._held.append((part.select(["step", "req_id", "sampled_token_ids"]), steps))
        self._loaded_to = max(int(steps[-1]), self._loaded_to or int(steps[-1]))
        inc = self._inc
        for r in _rows(part.select(["req_id", "step", "sampled_token_ids"])):
            rid, step, toks = r["req_id"], r["step"], r["sampled_token_ids"]
            k = bisect.bisect_right(inc.get(rid, []), step) - 1
            if k < 0 or not toks or (rid, k) in self._released:
                continue
            stream = self.streams.get((rid, k))
            if stream is None:  # 8 bytes a token, not a Python int's 36
                stream = self.streams[(rid, k)] = array("q")
            if len(toks) != 1:
                self.rows.setdefault((rid, k), {})[len(stream)] = toks
            stream.extend(toks)
        return True

    def load_all(self) -> None:
        while self._advance():
            pass

    def parts_at(self, step: int) -> list[tuple[pa.Table, np.ndarray]]:
        """The parts that may have rows of `step`, read on until a window past it; the held
        parts a window behind it are let go (a step asked for after that is read again)."""
        while self._parts is not None and (self._loaded_to is None
                                           or self._loaded_to < step + WINDOW):
            self._advance()
        if self._held and step < self._held[0][1][0]:
            again = []
            for part in self.sorted_parts():
                st = part["step"].to_numpy()
                if len(st) and st[0] <= step <= st[-1]:
                    again.append((part.select(["step", "req_id", "sampled_token_ids"]), st))
            return again
        self._held = [(t, st) for t, st in self._held if st[-1] >= step - WINDOW]
        return [(t, st) for t, st in self._held if st[0] <= step <= st[-1]]

    def at(self, key: tuple[str, int], position: int) -> list[int] | None:
        """A new list of the tokens at `position` of the incarnation's recorded stream."""
        stream = self.streams.get(key)
        if stream is None or len(stream) <= position:  # not read that far yet
            while (key not in self._released and self._parts is not None
                   and len(self.streams.get(key, ())) <= position):
                self._advance()
            stream = self.streams.get(key)
            if stream is None or len(stream) <= position:
                return None
        rows = self.rows.get(key)
        row = None if rows is None else rows.get(position)
        return [stream[position]] if row is None else list(row)

    def release(self, key: tuple[str, int]) -> None:
        """The re-run let go of this incarnation: its tokens are not asked for again."""
        self._released.add(key)
        self.streams.pop(key, None)
        self.rows.pop(key, None)


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


def _scheduled(engine) -> pa.Table:
    """The scheduled rows' columns the derived drafts read, in step order (read when a run
    gives drafts back from a trace without an input log)."""
    table, _ = _by_step(engine.read("scheduled", ["step", "req_id", "num_scheduled_tokens",
                                                  "spec_token_ids"]))
    return table


def _intro(engine) -> dict[str, list[int]]:
    """req_id -> the steps that introduce it (scheduled as new), read a part at a time."""
    news = []
    for part in engine.parts("scheduled"):
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
                  Outputs(engine, incarnations), {s: sorted(v) for s, v in finishes.items()},
                  engine, most_in_flight(engine), _structured(engine), intro,
                  added=added, schedule_args=args)
