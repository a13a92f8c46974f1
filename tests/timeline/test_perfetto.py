"""`export --perfetto` on real recordings (samples/, made by vLLM's Scheduler): the file parsed
back with Perfetto's own protobuf classes, its packets, tracks, sequence flags, interned names
and counts checked against the trace's tables as the reader gives them (not through the
exporter's queries). No trace processor binary can be had offline here (docs/timeline.md), so
the file is not loaded into one."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.replay.resim.record import catalog_findings
from vllm_contract.trace import open_trace

import readerkit

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def _pb():
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
    except ImportError as e:
        pytest.fail(f"needs the perfetto package: run `make test` (pip install -e .); {e}")
    return perfetto_trace_pb2


def _export(trace: Path, out: Path, *args: str) -> dict:
    r = CliRunner().invoke(app, ["export", str(trace), "--perfetto", str(out), "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _parse(path: Path):
    t = _pb().Trace()
    t.ParseFromString(path.read_bytes())
    return list(t.packet)


class Parsed:
    """The file's tracks and events, read the way a trace processor reads them: per
    sequence, incremental state and interned names; per track, its events in order."""

    def __init__(self, packets) -> None:
        pb = _pb()
        self.tracks = {}
        self.events: dict[int, list] = {}  # track uuid -> [(ts, type, name, event)]
        seen_seq: dict[int, dict] = {}
        for p in packets:
            if p.HasField("track_descriptor"):
                d = p.track_descriptor
                assert d.uuid not in self.tracks, f"track {d.uuid} described twice"
                self.tracks[d.uuid] = d
                continue
            assert p.HasField("track_event")
            seq = p.trusted_packet_sequence_id
            assert seq, "a track event outside a sequence"
            state = seen_seq.get(seq)
            if state is None:
                assert p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED, seq
                state = seen_seq[seq] = {"names": {}, "keys": {}, "defaults": None, "ts": 0}
            else:
                assert p.sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            for n in p.interned_data.event_names:
                state["names"][n.iid] = n.name
            for n in p.interned_data.debug_annotation_names:
                state["keys"][n.iid] = n.name
            if p.HasField("trace_packet_defaults"):
                state["defaults"] = p.trace_packet_defaults.track_event_defaults
            assert p.timestamp >= state["ts"], "a sequence goes back in time"
            state["ts"] = p.timestamp
            ev = p.track_event
            track = ev.track_uuid if ev.HasField("track_uuid") else state["defaults"].track_uuid
            name = ev.name or (state["names"][ev.name_iid] if ev.name_iid else "")
            args = {state["keys"][a.name_iid]: a for a in ev.debug_annotations}
            counters = list(ev.extra_double_counter_track_uuids) or (
                list(state["defaults"].extra_double_counter_track_uuids)
                if state["defaults"] is not None else [])
            self.events.setdefault(track, []).append(
                (p.timestamp, ev.type, name, ev, args, counters))

    def named(self, name: str):
        (uuid,) = [u for u, d in self.tracks.items() if d.name == name]
        return uuid

    def slices(self, track: int, depth: int | None = None) -> list[tuple[str, int, int]]:
        """(name, begin, end) of the track's slices (at `depth`: 0 the outermost)."""
        pb = _pb()
        out, open_ = [], []
        for ts, typ, name, *_ in self.events.get(track, []):
            if typ == pb.TrackEvent.TYPE_SLICE_BEGIN:
                open_.append((name, ts, len(open_)))
            elif typ == pb.TrackEvent.TYPE_SLICE_END:
                assert open_, f"an end without a begin on track {track}"
                name, begin, d = open_.pop()
                assert ts >= begin
                if depth is None or d == depth:
                    out.append((name, begin, ts))
        assert not open_, f"slices left open on track {track}"
        return out

    def instants(self) -> list:
        pb = _pb()
        return [(track, e) for track, evs in self.events.items() for e in evs
                if e[1] == pb.TrackEvent.TYPE_INSTANT]

    def lanes(self) -> list[int]:
        return [u for u, d in self.tracks.items() if d.name.startswith("requests ")]


@pytest.fixture(scope="module")
def leak(tmp_path_factory):
    """broken-leak (preemptions, resumes, a leaked finish), exported whole."""
    out = tmp_path_factory.mktemp("perfetto") / "leak.pftrace"
    counts = _export(SAMPLES / "broken-leak", out)
    return counts, Parsed(_parse(out))


def test_a_slice_a_step_with_its_counters(leak):
    counts, parsed = leak
    (e,) = open_trace(SAMPLES / "broken-leak").engines
    steps = e.read("steps").to_pylist()
    track = parsed.named("steps")
    slices = parsed.slices(track)
    assert [name for name, *_ in slices] == [f"step {r['step']}" for r in steps]
    assert counts["steps"] == len(steps)
    # a step's slice ends where the next begins, and begins where its schedule() began
    assert all(a[2] == b[1] for a, b in zip(slices, slices[1:]))
    assert slices[0][1] == steps[0]["t_ns"] - steps[0]["schedule_ns"]
    begins = [ev for ev in parsed.events[track] if ev[1] == _pb().TrackEvent.TYPE_SLICE_BEGIN]
    counter_names = {u: parsed.tracks[u].name for u in begins[0][5]}
    assert set(counter_names.values()) == {"tokens per step", "running", "waiting", "KV usage",
                                           "schedule() time"}
    for row, ev in zip(steps, begins):
        values = dict(zip((counter_names[u] for u in ev[5]), ev[3].extra_double_counter_values))
        assert values["tokens per step"] == row["total_num_scheduled_tokens"]
        assert values["running"] == row["num_running"]
        assert values["waiting"] == row["num_waiting"]
        assert values["KV usage"] == pytest.approx(row["kv_usage"] * 100)
        assert values["schedule() time"] == pytest.approx(row["schedule_ns"] / 1000)
    for u in counter_names:
        assert parsed.tracks[u].HasField("counter")


def _step_args(sample: Path) -> list[dict]:
    """Each step's arguments as the trace's tables give them: DuckDB over the reader's Arrow
    tables, resumes counted by the `resumed` flag (the exporter counts kind 'resumed')."""
    import duckdb

    (e,) = open_trace(sample).engines
    con = duckdb.connect()
    for table in ("steps", "scheduled", "finished", "preempted"):
        con.register(table, e.read(table))
    rows = con.sql("""
        SELECT s.step, s.total_num_scheduled_tokens AS tokens, s.num_new AS new,
               s.num_cached AS cached, s.schedule_ns,
               (SELECT COUNT(*) FROM scheduled r WHERE r.step = s.step AND r.resumed) AS resumed,
               (SELECT string_agg(req_id, ' ' ORDER BY req_id) FROM finished f
                WHERE f.step = s.step) AS finished,
               (SELECT string_agg(req_id, ' ' ORDER BY req_id) FROM preempted p
                WHERE p.step = s.step) AS preempted
        FROM steps s ORDER BY s.step""")
    out = [dict(zip(rows.columns, r)) for r in rows.fetchall()]
    con.close()
    return out


def test_every_step_arg_is_the_tables(leak):
    _, parsed = leak
    expected = _step_args(SAMPLES / "broken-leak")
    track = parsed.named("steps")
    begins = [ev for ev in parsed.events[track] if ev[1] == _pb().TrackEvent.TYPE_SLICE_BEGIN]
    assert [ev[2] for ev in begins] == [f"step {r['step']}" for r in expected]
    for row, ev in zip(expected, begins):
        args = ev[4]
        ints = {k: args[k].int_value for k in ("tokens", "new", "cached", "resumed",
                                               "schedule_ns")}
        assert ints == {k: row[k] for k in ints}, row["step"]
        ids = {k: args[k].string_value for k in ("finished", "preempted") if k in args}
        assert ids == {k: row[k] for k in ("finished", "preempted") if row[k]}, row["step"]
        assert set(args) == set(ints) | set(ids)
    # the sample exercises every argument: ids, resumes and a schedule() that took time
    for k in ("finished", "preempted"):
        assert any(r[k] for r in expected), k
    assert any(r["resumed"] for r in expected) and all(r["schedule_ns"] > 0 for r in expected)


def test_requests_in_as_many_lanes_as_the_peak_concurrency(leak):
    counts, parsed = leak
    (e,) = open_trace(SAMPLES / "broken-leak").engines
    introduced = Counter(e.read("requests", ["req_id"])["req_id"].to_pylist())
    lanes = parsed.lanes()
    requests = [s for lane in lanes for s in parsed.slices(lane, depth=0)]
    assert Counter(name for name, *_ in requests) == introduced
    # no two requests at once on a lane, and at some moment every lane is busy
    for lane in lanes:
        spans = sorted((b, end) for _, b, end in parsed.slices(lane, depth=0))
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    moments = sorted({b for _, b, _ in requests})
    peak = max(sum(1 for _, b, end in requests if b <= t < end) for t in moments)
    assert len(lanes) == peak == counts["lanes"]
    phases = Counter(name for lane in lanes for name, *_ in parsed.slices(lane, depth=1))
    assert set(phases) <= {"waiting", "prefill", "decode", "preempted"}
    assert phases["prefill"] >= len(introduced) and phases["decode"] >= 1


def test_a_flow_from_each_preemption_to_the_run_after_it(leak):
    _, parsed = leak
    (e,) = open_trace(SAMPLES / "broken-leak").engines
    preempted = len(e.read("preempted"))
    resumed = sum(1 for k in e.read("scheduled", ["kind"])["kind"].to_pylist() if k == "resumed")
    assert preempted > 0
    events = [ev[3] for lane in parsed.lanes() for ev in parsed.events[lane]]
    begun = [f for ev in events for f in ev.flow_ids]
    ended = [f for ev in events for f in ev.terminating_flow_ids]
    assert len(begun) == len(set(begun)) == preempted
    assert len(ended) == resumed and set(ended) <= set(begun)
    preempted_slices = sum(1 for lane in parsed.lanes()
                           for name, *_ in parsed.slices(lane, depth=1) if name == "preempted")
    assert preempted_slices == preempted


def test_every_finding_an_instant_on_its_step_and_request(leak):
    counts, parsed = leak
    found = [f for f in catalog_findings(SAMPLES / "broken-leak")]
    assert "finished.leaked" in {f.invariant for f in found}
    instants = parsed.instants()
    steps_track = parsed.named("steps")
    on_steps = Counter(e[2] for track, e in instants if track == steps_track)
    assert {k: v for k, v in on_steps.items() if k in {f.invariant for f in found}} == \
        Counter(f.invariant for f in found)
    leak_ = next(f for f in found if f.invariant == "finished.leaked")
    on_lanes = [(track, e) for track, e in instants if track in parsed.lanes()
                and e[2] == "finished.leaked"]
    assert on_lanes and on_lanes[0][1][4]["req_id"].string_value == leak_.req_id
    args = next(e[4] for track, e in instants if e[2] == "finished.leaked")
    assert args["title"].string_value == leak_.title
    assert args["message"].string_value == leak_.details
    assert counts["findings"] == sum(on_steps.values())  # every severity, info too


def test_a_finding_at_a_step_not_recorded_is_drawn_on_the_next(tmp_path):
    """A dropped step (the recorder's dropped_steps) or one past the last recorded: its
    findings are still drawn, on the next recorded step or the last, saying so."""
    from dataclasses import replace

    from vllm_contract.replay.timeline import spans
    from vllm_contract.replay.timeline.perfetto import Writer

    (e,) = spans.read(SAMPLES / "broken-leak")
    s = e.steps
    leak = next(f for f in e.findings if f.invariant == "finished.leaked")
    cases = ((s.step != leak.step, leak.step + 1),  # its step dropped
             (s.step < leak.step, leak.step - 1))  # the recording stops before it
    for n, (keep, drawn_on) in enumerate(cases):
        cut = spans.Steps(s.step[keep], s.start_ns[keep], s.end_ns[keep],
                          {k: v[keep] for k, v in s.columns.items()}, s.finished, s.preempted)
        out = tmp_path / f"{n}.pftrace"
        Writer(out).write([replace(e, steps=cut)])
        parsed = Parsed(_parse(out))
        steps_track = parsed.named("steps")
        on_steps = [ev for track, ev in parsed.instants() if track == steps_track]
        assert Counter(ev[2] for ev in on_steps) == Counter(f.invariant for f in e.findings)
        (drawn,) = [ev for ev in on_steps if ev[2] == "finished.leaked"]
        assert drawn[4]["step"].int_value == leak.step
        assert drawn[4]["drawn_on_step"].int_value == drawn_on
        begun = {name: ts for name, ts, _ in parsed.slices(steps_track)}
        assert drawn[0] == begun[f"step {drawn_on}"]
        (lane,) = [ev for track, ev in parsed.instants()
                   if track in parsed.lanes() and ev[2] == "finished.leaked"]
        assert lane[4]["drawn_on_step"].int_value == drawn_on
        # a finding on a recorded step does not say it was moved
        assert all("drawn_on_step" not in ev[4] for ev in on_steps if ev is not drawn)


def test_from_until_and_engines_of_a_fleet(tmp_path):
    fleet = readerkit.sample_fleet(tmp_path / "fleet")
    counts = _export(fleet, tmp_path / "all.pftrace")
    parsed = Parsed(_parse(tmp_path / "all.pftrace"))
    processes = [d for d in parsed.tracks.values() if d.HasField("process")]
    assert sorted(d.process.process_name for d in processes) == ["engine a", "engine b"]
    assert len({d.process.pid for d in processes}) == 2 and counts["engines"] == 2
    steps = [u for u, d in parsed.tracks.items() if d.name == "steps"]
    assert {parsed.tracks[u].parent_uuid for u in steps} == {d.uuid for d in processes}
    _export(fleet, tmp_path / "cut.pftrace", "--engine", "b", "--from", "10", "--until", "29")
    cut = Parsed(_parse(tmp_path / "cut.pftrace"))
    names = [n for n, *_ in cut.slices(cut.named("steps"))]
    assert names == [f"step {i}" for i in range(10, 30)]


def test_bad_input_is_one_line(tmp_path):
    def run(*args):
        return CliRunner().invoke(app, ["export", *map(str, args)])

    for args, said in (((tmp_path / "nope", "--perfetto", tmp_path / "x"), "no such trace"),
                       ((SAMPLES / "mixed", "--perfetto", tmp_path / "x", "--from", 9,
                         "--until", 3), "--from 9 is after --until 3"),
                       ((SAMPLES / "mixed", "--perfetto", tmp_path / "x", "--engine", "zz"),
                        "no engine 'zz'"),
                       ((SAMPLES / "mixed", "--perfetto", tmp_path), "is a directory")):
        r = run(*args)
        assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1, r.output
        assert said in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob("*.partial"))
