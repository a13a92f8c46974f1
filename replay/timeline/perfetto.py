"""`export --perfetto`: a timeline as Perfetto's native TrackEvent protobuf (docs/timeline.md),
written packet by packet with the `perfetto` package's streaming builder and protobuf classes
(Chrome's JSON format, Perfetto's legacy input, hits walls at a few hundred MB). Per engine a
process: a "steps" track (a slice a step, the counters carried on it as extra counter values),
request lanes (a slice a request with its phases nested, flows from a preemption to the run
after it) and the findings as instant events. Each track is a packet sequence of its own, in
time order, with its names interned on that sequence."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from vllm_contract.replay.timeline.spans import COUNTERS, Engine, Finding, Request

_SEQ_CLEARED, _SEQ_NEEDS = 1, 2  # TracePacket.SequenceFlags
_LANES_AT = 100  # a track's uuid within its engine: process 0, steps 1, counters 2.., lanes 100..


def _pb():
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    return perfetto_trace_pb2


class _Sequence:
    """One packet sequence: its id, and the names interned on it so far."""

    def __init__(self, seq_id: int) -> None:
        self.id = seq_id
        self.names: dict[str, int] = {}
        self.keys: dict[str, int] = {}
        self.started = False

    def packet(self, builder: Any) -> Any:
        p = builder.create_packet()
        p.trusted_packet_sequence_id = self.id
        if not self.started:
            p.sequence_flags = _SEQ_CLEARED
            self.started = True
        else:
            p.sequence_flags = _SEQ_NEEDS
        return p

    def name(self, packet: Any, name: str) -> int:
        return self._intern(self.names, packet.interned_data.event_names, name)

    def key(self, packet: Any, name: str) -> int:
        return self._intern(self.keys, packet.interned_data.debug_annotation_names, name)

    @staticmethod
    def _intern(table: dict[str, int], entries: Any, name: str) -> int:
        """`name`'s iid on this sequence; interned in this packet when new to it."""
        iid = table.get(name)
        if iid is None:
            iid = table[name] = len(table) + 1
            e = entries.add()
            e.iid, e.name = iid, name
        return iid

    def args(self, packet: Any, event: Any, values: dict) -> None:
        for k, v in values.items():
            a = event.debug_annotations.add()
            a.name_iid = self.key(packet, k)
            if isinstance(v, bool):
                a.bool_value = v
            elif isinstance(v, int):
                a.int_value = v
            elif isinstance(v, float):
                a.double_value = v
            else:
                a.string_value = str(v)


def _drawn_on(s: Any, step: int) -> int:
    """The index of the recorded step a finding at `step` is drawn on: its own, else the next
    recorded one, else (past the last) the last."""
    return min(int(np.searchsorted(s.step, step)), len(s) - 1)


class Writer:
    """Writes engines' timelines to one file; `progress(done, total)` after every chunk of
    steps."""

    def __init__(self, out: Path, progress: Callable[[int, int], None] | None = None) -> None:
        self.out = Path(out)
        self.progress = progress or (lambda done, total: None)
        self._seq = 0
        self._flow = 0
        self.counts = {"packets": 0, "slices": 0, "instants": 0, "flows": 0}

    def write(self, engines: list[Engine]) -> dict:
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(self.out.name + ".partial")
        total = sum(len(e.steps) for e in engines)
        done = 0
        with open(tmp, "wb") as f:
            b = StreamingTraceProtoBuilder(f)
            self._emit = lambda p: (b.write_packet(p), self._count())
            for i, e in enumerate(engines):
                base = (i + 1) << 20
                self._descriptors(b, e, i, base)
                for n in self._steps(b, e, base):
                    self.progress(done + n, total)
                done += len(e.steps)
                self._lanes(b, e, base)
        tmp.replace(self.out)  # a file cut short by a crash is never taken for a whole one
        return dict(self.counts)

    def _count(self) -> None:
        self.counts["packets"] += 1

    def _next_seq(self) -> _Sequence:
        self._seq += 1
        return _Sequence(self._seq)

    # -- tracks -------------------------------------------------------------------------------
    def _descriptors(self, b: Any, e: Engine, index: int, base: int) -> None:
        def track(uuid: int, name: str | None = None, parent: int | None = None) -> Any:
            p = b.create_packet()
            d = p.track_descriptor
            d.uuid = uuid
            if parent is not None:
                d.parent_uuid = parent
            if name is not None:
                d.name = name
            return p, d

        p, d = track(base)
        d.process.pid = index + 1
        d.process.process_name = f"engine {e.name}"
        d.child_ordering = _pb().TrackDescriptor.EXPLICIT  # steps, counters, then lanes
        self._emit(p)
        p, d = track(base + 1, "steps", base)
        d.sibling_order_rank = 0
        self._emit(p)
        for j, (name, unit, _) in enumerate(COUNTERS):
            p, d = track(base + 2 + j, name, base)
            d.counter.unit_name = unit
            d.sibling_order_rank = 1 + j
            self._emit(p)
        for lane in range(e.lanes):
            p, d = track(base + _LANES_AT + lane, f"requests {lane}", base)
            d.sibling_order_rank = 100 + lane
            self._emit(p)

    def _steps(self, b: Any, e: Engine, base: int) -> Iterator[int]:
        """A slice a step on the steps track, its counters' values carried on the slice's
        begin, and the findings of that step as instants inside it."""
        pb = _pb()
        seq = self._next_seq()
        s = e.steps
        track = base + 1
        counters = [base + 2 + j for j in range(len(COUNTERS))]
        values = [s.columns[c].astype(float) for _, _, c in COUNTERS]
        # a finding at a step not recorded (dropped, pruned, past the last) is drawn on the
        # next recorded step, else the last; one of the whole trace, on the first
        on: dict[int, list[Finding]] = {}
        for f in e.findings:
            on.setdefault(0 if f.step is None else _drawn_on(s, f.step), []).append(f)
        cols = s.columns
        for i in range(len(s)):
            step = int(s.step[i])
            p = seq.packet(b)
            if i == 0:  # the sequence's defaults: its events' track and counter tracks
                d = p.trace_packet_defaults.track_event_defaults
                d.track_uuid = track
                d.extra_double_counter_track_uuids.extend(counters)
            p.timestamp = int(s.start_ns[i])
            ev = p.track_event
            ev.type = pb.TrackEvent.TYPE_SLICE_BEGIN
            ev.name = f"step {step}"  # one name a step: interning it would only add
            ev.extra_double_counter_values.extend(float(v[i]) for v in values)
            args = {"tokens": int(cols["tokens"][i]), "new": int(cols["num_new"][i]),
                    "cached": int(cols["num_cached"][i]), "resumed": int(cols["resumed"][i]),
                    "schedule_ns": int(cols["schedule_ns"][i])}
            if s.finished.get(step):
                args["finished"] = " ".join(s.finished[step])
            if s.preempted.get(step):
                args["preempted"] = " ".join(s.preempted[step])
            seq.args(p, ev, args)
            self._emit(p)
            self.counts["slices"] += 1
            for f in on.pop(i, []):
                self._instant(b, seq, track, int(s.start_ns[i]), f, step)
            p = seq.packet(b)
            p.timestamp = int(s.end_ns[i])
            p.track_event.type = pb.TrackEvent.TYPE_SLICE_END
            self._emit(p)
            if i % 50_000 == 49_999:
                yield i + 1
        yield len(s)

    def _instant(self, b: Any, seq: _Sequence, track: int, ts: int, f: Finding,
                 drawn_on: int | None = None) -> None:
        """`drawn_on`: the recorded step it is drawn on, said when it is not its own."""
        pb = _pb()
        p = seq.packet(b)
        p.timestamp = ts
        ev = p.track_event
        ev.type = pb.TrackEvent.TYPE_INSTANT
        ev.track_uuid = track
        ev.name_iid = seq.name(p, f.invariant)
        args = {"severity": f.severity, "title": f.title, "message": f.details}
        if f.step is not None:
            args["step"] = f.step
            if drawn_on is not None and drawn_on != f.step:
                args["drawn_on_step"] = drawn_on
        if f.req_id:
            args["req_id"] = f.req_id
        seq.args(p, ev, args)
        self._emit(p)
        self.counts["instants"] += 1

    def _lanes(self, b: Any, e: Engine, base: int) -> None:
        """Per lane, its requests in order: a slice named by the request id spanning its
        life, its phases nested in it; a finding on a request, an instant on its lane at the
        finding's step (inside its life or after it: a leaked finish is found later)."""
        import heapq

        s = e.steps
        lanes: dict[int, list[Request]] = {}
        for r in e.requests:
            lanes.setdefault(r.lane, []).append(r)
        by_id: dict[str, list[Request]] = {}
        for r in e.requests:
            by_id.setdefault(r.req_id, []).append(r)
        on: dict[int, list[tuple[int, int, Finding]]] = {}  # lane -> (ts, n, finding)
        drawn: dict[int, int] = {}  # n -> the recorded step it is drawn at
        for n, f in enumerate(e.findings):
            r = self._holder(by_id.get(f.req_id or "", []), f)
            if r is not None:
                on.setdefault(r.lane, []).append((s.ts(f.step), n, f))
                drawn[n] = int(s.step[_drawn_on(s, f.step)])
        for lane, requests in sorted(lanes.items()):
            seq = self._next_seq()
            track = base + _LANES_AT + lane
            events = self._request_events(s, sorted(requests, key=lambda r: r.first))
            stray = sorted(on.get(lane, []))
            # in time order; at one moment a request's own events first
            merged = heapq.merge(((ts, 0, i, ev) for i, (ts, ev) in enumerate(events)),
                                 ((ts, 1, n, f) for ts, n, f in stray))
            for ts, kind, n, item in merged:
                if kind:
                    self._instant(b, seq, track, ts, item, drawn.get(n))
                else:
                    self._slice_event(b, seq, track, ts, item)

    @staticmethod
    def _holder(requests: list[Request], f: Finding) -> Request | None:
        """Of the instances of the finding's request, the one it is about: the last one begun
        by its step."""
        if f.step is None:
            return None
        begun = [r for r in requests if r.first <= f.step]
        return max(begun, key=lambda r: r.first) if begun else None

    def _request_events(self, s: Any, requests: list[Request]) -> list[tuple[int, tuple]]:
        """(ts, event) of a lane's requests: ("begin", name, args, flow, ends-flow) and
        ("end",), in order."""
        out: list[tuple[int, tuple]] = []
        for r in requests:
            out.append((s.ts(r.first), ("begin", r.req_id, {
                "req_id": r.req_id, "introduced": r.intro_step, "first_step": r.first,
                "last_step": r.last}, None, None, False)))
            flow = None
            for phase, first, last in r.phases:
                starts = None
                if phase == "preempted":
                    self._flow += 1
                    starts = self._flow
                out.append((s.ts(first), ("begin", phase, {"first_step": first,
                                                          "last_step": last},
                                          starts, flow, True)))
                flow = starts
                out.append((s.ts(last + 1), ("end",)))
            out.append((s.ts(r.last + 1), ("end",)))
        return out

    def _slice_event(self, b: Any, seq: _Sequence, track: int, ts: int, ev_: tuple) -> None:
        pb = _pb()
        p = seq.packet(b)
        p.timestamp = ts
        ev = p.track_event
        ev.track_uuid = track
        if ev_[0] == "end":
            ev.type = pb.TrackEvent.TYPE_SLICE_END
            self._emit(p)
            return
        _, name, args, starts, ends, interned = ev_
        ev.type = pb.TrackEvent.TYPE_SLICE_BEGIN
        if interned:
            ev.name_iid = seq.name(p, name)
        else:
            ev.name = name  # a request id: one slice each, interning it would only add
        if starts is not None:  # a preemption: its flow goes to the run after it
            ev.flow_ids.append(starts)
            self.counts["flows"] += 1
        if ends is not None:
            ev.terminating_flow_ids.append(ends)
        seq.args(p, ev, args)
        self._emit(p)
        self.counts["slices"] += 1


def export(trace: str | Path, out: str | Path, *, engine: str | None = None,
           first: int | None = None, last: int | None = None,
           progress: Callable[[int, int], None] | None = None) -> dict:
    """Write the Perfetto timeline of `trace` (every engine, or `engine`; steps
    `first`..`last`) to `out`; the counts of what was written."""
    from vllm_contract.replay.timeline.spans import read

    engines = read(trace, engine, first, last)
    counts = Writer(Path(out), progress).write(engines)
    counts.update(engines=len(engines), steps=sum(len(e.steps) for e in engines),
                  requests=sum(len(e.requests) for e in engines),
                  findings=sum(len(e.findings) for e in engines),
                  lanes=sum(e.lanes for e in engines), bytes=Path(out).stat().st_size)
    return counts
