"""`resim` stopped at a step and recorded anew, on the real vLLM Scheduler (no mocks): a break
hook sees the re-run's own scheduler, the calls about to be fed (and they are the ones fed) and
the recording's output for the step (and it is what the re-run then makes); pdb is the default,
through breakpoint(); --until ends the run after its step; --out records the re-run with the
project's recorder into a trace the catalog checks, equal to the recording on an identical
scenario and without the error a buggy Scheduler subclass recorded."""

from __future__ import annotations

import sys

import pytest

from vllm_contract import replay
from vllm_contract.errors import TraceError
from vllm_contract.replay.resim import Break
from vllm_contract.rig import scenarios
from vllm_contract.trace import open_trace

import resimkit

TIMES = {"t_ns", "schedule_ns"}


@pytest.fixture(scope="module")
def traces(tiny_model, tmp_path_factory):
    """The id_reuse scenario (a request added while another runs) recorded with vLLM's
    Scheduler, with DropFinishedOnce in its place (the rig builds `Scheduler` by name from
    vLLM's module), and with two batches in flight."""
    root = tmp_path_factory.mktemp("resim-debug")
    scenarios.run("id_reuse", tiny_model, root / "good")
    scenarios.run("id_reuse", tiny_model, root / "async", batch_queue=2)
    with resimkit.bug_scheduler(root, "debug_bug_sched") as bug:
        assert resimkit.record_with(bug, "id_reuse", tiny_model,
                                    root / "bug").scheduler.broken
        yield root


def _break_step(trace) -> int:
    """A step past the first that adds requests: the scheduler already holds some."""
    steps = open_trace(trace).engines[0].read("steps", ["step", "num_new"]).to_pylist()
    return next(r["step"] for r in steps if r["step"] > 0 and r["num_new"])


class Witness:
    """A break hook that writes down what it was given, then watches the scheduler's next
    add_request() and schedule() calls (wrapping the instance's own methods, which it puts
    back after the schedule)."""

    def __init__(self) -> None:
        self.stops: list[Break] = []
        self.held: list[str] = []  # the scheduler's requests at the stop
        self.fed: list = []  # what was added, then what schedule() returned
        self.produced = None

    def __call__(self, stop: Break) -> None:
        from vllm_contract.replay.worker.canonical import from_live

        self.stops.append(stop)
        s = stop.scheduler
        self.held = sorted(s.requests)
        add, schedule = s.add_request, s.schedule

        def watched_add(req):
            self.fed.append(("add_request", req))
            return add(req)

        def watched_schedule(*a, **kw):
            so = schedule(*a, **kw)
            self.fed.append(("schedule", None))
            self.produced = from_live(so)
            del s.add_request, s.schedule
            return so

        s.add_request, s.schedule = watched_add, watched_schedule


def test_a_hook_sees_the_re_runs_scheduler_the_pending_calls_and_the_recorded_output(traces):
    step = _break_step(traces / "good")
    witness = Witness()
    run = replay.resim(traces / "good", break_at=step, break_hook=witness)
    results = list(run)
    assert len(witness.stops) == 1
    stop = witness.stops[0]
    assert stop.step == step and stop.scheduler is run.scheduler and stop.run is run
    assert [p.call for p in stop.pending][-1] == "schedule"
    added = [p.request for p in stop.pending if p.call == "add_request"]
    assert added and not set(p.req_id for p in stop.pending[:-1]) & set(witness.held)
    # the pending calls are the ones then made, the very Request objects, in order
    assert [p.call for p in stop.pending] == [call for call, _ in witness.fed]
    assert all(p.request is req for p, (_, req) in zip(stop.pending, witness.fed))
    assert sorted(r["req_id"] for r in stop.recorded["scheduled_new_reqs"]) == sorted(
        p.req_id for p in stop.pending[:-1])
    # identical scenario: the recording's output for the step is what the re-run made
    assert witness.produced == stop.recorded
    assert stop.recorded_finishes == run.inputs.finishes.get(step, [])
    assert run.summary.identical and len(results) == run.summary.recorded_steps


def debugger(*args, **kwargs) -> None:
    """PYTHONBREAKPOINT's target in the test below: what pdb would show at the prompt."""
    frame = sys._getframe(1)
    SEEN.append({k: frame.f_locals.get(k) for k in ("step", "scheduler", "pending",
                                                    "recorded")})


SEEN: list[dict] = []


def test_pdb_is_the_default_through_breakpoint_and_PYTHONBREAKPOINT(traces, monkeypatch,
                                                                    capsys):
    SEEN.clear()
    monkeypatch.setenv("PYTHONBREAKPOINT", f"{__name__}.debugger")
    run = replay.resim(traces / "good", break_at=2)
    assert run.summary.identical
    assert len(SEEN) == 1 and SEEN[0]["step"] == 2 and SEEN[0]["scheduler"] is run.scheduler
    assert SEEN[0]["recorded"] == run.inputs.plains[2]
    assert [p.call for p in SEEN[0]["pending"]][-1] == "schedule"
    assert "stopped before step 2's schedule()" in capsys.readouterr().err
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")  # no debugger: the run goes on
    assert replay.resim(traces / "good", break_at=2).summary.identical and len(SEEN) == 1


@pytest.mark.parametrize("name", ["good", "async"])
def test_until_stops_after_its_step(traces, name):
    run = replay.resim(traces / name, until=4)
    results = list(run)
    assert [r.step for r in results] == [0, 1, 2, 3, 4]
    s = run.summary
    assert s.until == 4 and s.identical and s.steps == 5 < s.recorded_steps
    assert s.as_dict()["until"] == 4


def test_a_step_outside_the_recording_or_a_hook_that_does_not_import_is_refused(traces):
    trace = traces / "good"
    last = open_trace(trace).engines[0].read("steps", ["step"]).num_rows - 1
    with pytest.raises(TraceError, match=f"--break-at {last + 1}: the recording has steps 0 "):
        replay.resim(trace, break_at=last + 1)
    with pytest.raises(TraceError, match="--until -1: the recording has steps 0 to "):
        replay.resim(trace, until=-1)
    with pytest.raises(TraceError, match="break hook no_such_mod:f is not importable"):
        replay.resim(trace, break_at=1, break_hook="no_such_mod:f")
    with pytest.raises(TraceError, match="break hook collections:nope is not importable"):
        replay.resim(trace, break_at=1, break_hook="collections:nope")
    with pytest.raises(TraceError, match="--break-hook needs --break-at"):
        replay.resim(trace, break_hook=f"{__name__}:debugger")
    with pytest.raises(TraceError, match="--break-at 3 is after --until 2"):
        replay.resim(trace, break_at=3, until=2)


def _rows(trace, table: str) -> list[dict]:
    rows = open_trace(trace).engines[0].read(table).to_pylist()
    return [{k: v for k, v in r.items() if k not in TIMES} for r in rows]


def test_the_re_run_recorded_with_out_equals_the_recording_and_the_catalog_finds_nothing(
        traces, tmp_path):
    out = tmp_path / "new"
    run = replay.resim(traces / "good", out=out)
    assert run.summary.identical
    rec = run.summary.recorded
    assert rec.trace == str(out) and rec.errors == rec.warnings == 0 and rec.findings == []
    for table in ("steps", "scheduled", "requests", "model_outputs"):
        assert _rows(out, table) == _rows(traces / "good", table), table
    manifest = open_trace(out).engines[0].manifest
    assert manifest["resim"]["trace"] == str(traces / "good")
    assert manifest["started_by"] == "vllm-contract resim"
    # a normal trace: resim itself re-runs it identically, and --out is never written over
    assert replay.resim(out).summary.identical
    with pytest.raises(TraceError, match="already exists and is not an empty directory"):
        replay.resim(traces / "good", out=out)


def test_a_buggy_recording_re_run_with_the_stock_class_records_no_error(traces, tmp_path):
    from vllm_contract.replay.resim import record

    recorded = record.check(record.Recorded(str(traces / "bug")))
    assert recorded.errors > 0 and any(f.startswith("finished.leaked")
                                       for f in recorded.findings)
    run = replay.resim(traces / "bug", out=tmp_path / "fixed")
    s = run.summary
    assert not s.identical and s.first.field == "finished_req_ids"
    assert s.recorded.errors == 0, s.recorded.findings
    # the subclass re-run records its own bug again
    again = replay.resim(traces / "bug", scheduler_cls="debug_bug_sched:DropFinishedOnce",
                         out=tmp_path / "again").summary
    assert again.identical and again.recorded.errors == recorded.errors


def _abort_step(trace) -> tuple[int, str]:
    """The first step whose schedule() the input log has an abort before, and its request."""
    calls = list(replay.resim(trace).inputs.calls)
    at = next(i for i, c in enumerate(calls) if c.kind == "abort")
    return next(c.step for c in calls[at:] if c.kind == "schedule"), calls[at].req_id


@pytest.fixture(scope="module")
def aborts(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("resim-aborts")
    scenarios.run("aborts", tiny_model, path)
    return path


def test_a_logged_abort_is_pending_at_the_break_and_is_made_from_the_list(aborts):
    step, req_id = _abort_step(aborts)
    seen: list = []
    run = replay.resim(aborts, break_at=step, break_hook=lambda stop: seen.append(
        [(p.call, p.req_id, p.args) for p in stop.pending]))
    list(run)
    assert run.summary.identical
    (pending,) = seen
    aborts_seen = [p for p in pending if p[0] == "finish_requests"]
    assert aborts_seen and aborts_seen[0][2][0] == req_id
    assert aborts_seen[0][2][1].startswith("FINISHED_")  # the recorded status, by name
    assert pending[-1][0] == "schedule"

    def drop(stop):  # the hook edits what is made: without the abort the re-run diverges
        stop.pending[:] = [p for p in stop.pending if p.call != "finish_requests"]

    dropped = replay.resim(aborts, break_at=step, break_hook=drop)
    list(dropped)
    assert not dropped.summary.identical and dropped.summary.first.step >= step
    assert req_id in dropped.summary.first.difference
