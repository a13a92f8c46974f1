"""The writer process: what crosses from the engine (handoff.py), the ring (ring.py), and the
engine going on when the writer process dies."""

from __future__ import annotations

import json

import os
import pickle
import resource
import select
import signal

import pytest

from vllm_contract.plain import opaque, to_plain, type_name
from vllm_contract.recorder import attach, handoff
from vllm_contract.recorder.ring import RingReader, RingWriter
from vllm_contract.recorder.writer_proc import ProcessWriter
from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios
from vllm_contract.rig.harness import Harness


def test_real_vllm_objects_cross_as_their_plain_form(tiny_model):
    """SamplingParams, NewRequestData and a tensor from the real vLLM: what the writer process
    gets has exactly the plain form, type name and description of the original."""
    import torch
    from vllm import SamplingParams

    h = Harness(tiny_model, scenarios.SCENARIOS["mixed"].config)
    new = []
    original = h.scheduler.schedule

    def schedule(*a, **kw):
        out = original(*a, **kw)
        new.extend(out.scheduled_new_reqs)
        return out

    h.scheduler.schedule = schedule
    h.add("a", list(range(1, 40)), max_tokens=3)
    h.step()
    assert new, "the harness introduced no request"
    sp = SamplingParams(temperature=0.5, top_k=7, stop=["x"], max_tokens=9, seed=3)
    tensor = torch.zeros(3, 5, dtype=torch.float16)
    values = {"request": new[0], "sampling": sp, "tensor": tensor, "nested": [{"t": tensor}]}
    got = handoff.decode(handoff.Encoder().encode(values))
    assert to_plain(got) == to_plain(values)
    assert type_name(got["sampling"]) == type_name(sp)
    assert opaque(got["tensor"]) == opaque(tensor)
    assert got["request"].req_id == "a" and got["request"].block_ids == new[0].block_ids


def test_every_scheduler_output_of_a_run_crosses_as_its_plain_form(tiny_model):
    """Each SchedulerOutput of the mixed scenario (new, cached, preempted, aborted, an id
    reused) reaches the writer process with exactly its plain form."""
    enc = handoff.Encoder()
    seen = []

    def check(out):
        assert to_plain(handoff.decode(enc.encode(out))) == to_plain(out)
        seen.append(len(out.num_scheduled_tokens))

    scenarios.run("mixed", tiny_model, on_schedule=check)
    assert len(seen) > 20 and max(seen) > 2


def test_reading_an_item_never_runs_code_from_it(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        handoff.decode(pickle.dumps(Evil()))
    assert not marker.exists()


def test_ring_keeps_order_across_the_wrap_and_refuses_what_does_not_fit():
    ring = RingWriter(1000)
    reader = RingReader(ring.fd, ring.commit_r, ring.wake_r, ring.capacity)
    sent, got = [], []
    for i in range(200):
        data = bytes([i % 251]) * (i * 7 % 180 + 1)
        commit = i % 2 == 0 or i == 199  # the others go with the next commit
        assert ring.put(data, commit=commit)
        sent.append(data)
        if commit and i % 4 == 0:  # (the reader blocks until a commit comes)
            reader.wait(busy=False)
            got.extend(reader.items())
            reader.release()
    reader.wait(busy=False)
    got.extend(reader.items())
    assert got == sent  # every item once, in order, whole, also those that wrapped round
    reader.release()
    assert ring.put(b"x" * 996) and not ring.put(b"y")  # full: refused, nothing written
    reader.wait(busy=False)
    assert list(reader.items()) == [b"x" * 996]
    reader.release()
    # A busy reader takes commits at its next round, or at once when woken; the end of the
    # commits ends its waiting (within two rounds: the last commits, then the end).
    assert ring.put(b"a") and reader.wait(busy=True) and list(reader.items()) == [b"a"]
    reader.release()
    assert ring.put(b"b")
    ring.wake()
    assert reader.wait(busy=True) and list(reader.items()) == [b"b"]
    reader.release()
    # Filling the ring past half wakes the reader (once, until it has read on).
    woken = []
    for i in range(9):
        assert ring.put(bytes(56))
        woken.append(bool(select.select([ring.wake_r], [], [], 0)[0]))
    assert woken == [False] * 8 + [True]  # 9 x 60 bytes of 1000 left less than half free
    assert reader.wait(busy=True) and len(list(reader.items())) == 9
    reader.release()
    assert ring.put(b"c")
    ring.close_commits()
    rounds = [reader.wait(busy=True), reader.wait(busy=True)]
    assert list(reader.items()) == [b"c"] and rounds[-1] is False
    ring.close()


def test_ring_reader_waits_on_descriptors_numbered_above_1024():
    """The child gets the engine process's descriptor numbers, which a busy server can push
    past select()'s limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    ring = RingWriter(4096)
    commit_fd, wake_fd = os.dup2(ring.commit_r, 2000), os.dup2(ring.wake_r, 2001)
    try:
        reader = RingReader(ring.fd, commit_fd, wake_fd, ring.capacity)
        assert ring.put(b"x")
        ring.wake()
        assert reader.wait(busy=True) and list(reader.items()) == [b"x"]
        assert ring.put(b"y") and reader.wait(busy=False) and list(reader.items()) == [b"y"]
    finally:
        os.close(commit_fd)
        os.close(wake_fd)
        ring.close()


def test_process_and_thread_writers_write_the_same_tables(tiny_model, tmp_path):
    traces = {}
    for writer in ("thread", "process"):
        scenarios.run("mixed", tiny_model, tmp_path / writer, writer=writer)
        (traces[writer],) = open_trace(tmp_path / writer).engines
    assert traces["process"].manifest["writer"]["process"] is True
    assert traces["thread"].manifest["writer"]["process"] is False
    timing = {"t_ns", "schedule_ns", "update_ns"}
    for table in ("steps", "scheduled", "requests", "finished", "preempted", "updates",
                  "model_outputs", "finish_events"):
        a, b = (traces[w].read(table) for w in ("thread", "process"))
        cols = [c for c in a.column_names if c not in timing]
        rows = [sorted(map(repr, t.select(cols).to_pylist())) for t in (a, b)]
        assert rows[0] == rows[1], table
        assert rows[0], f"{table} is empty: the scenario did not exercise it"


def test_engine_goes_on_when_the_writer_process_dies(tiny_model, tmp_path):
    h = Harness(tiny_model, scenarios.SCENARIOS["mixed"].config)
    rec = attach(h.scheduler, tmp_path)  # a scheduler alone (no model on the CPU): the process
    assert isinstance(rec.writer, ProcessWriter)
    for i in range(4):
        h.add(f"r{i}", list(range(1, 30)), max_tokens=20)
    for _ in range(5):
        h.step()
    assert rec.flush(30)
    os.kill(rec.writer.proc.pid, signal.SIGKILL)
    rec.writer.proc.wait(10)
    for _ in range(40):  # the next commit finds the pipe broken: recording stops, not the engine
        h.step()
    assert rec.failed
    assert all(len(h.outputs[f"r{i}"]) == 20 for i in range(4))
    rec.close(timeout=5)
    (engine,) = open_trace(tmp_path).engines
    errors = [e["error"] for e in engine.manifest["recorder_errors"]]
    assert any("writer process ended unexpectedly" in e for e in errors), errors
    assert engine.manifest["closed_cleanly"] is False
    assert engine.read("steps").num_rows >= 5  # what was flushed before its death stays


def test_unknown_writer_is_refused(tiny_model, tmp_path):
    h = Harness(tiny_model, scenarios.SCENARIOS["mixed"].config)
    with pytest.raises(ValueError, match="writer='disk'"):
        attach(h.scheduler, tmp_path, writer="disk")


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_an_engine_side_recorder_failure_is_noted_and_the_engine_goes_on(tiny_model, tmp_path,
                                                                        writer):
    """A KV-connector metadata object that refers to itself: the writer process's pickler
    refuses the cycle (the writer thread only describes it). Either way the engine's steps
    go on; with the writer process that step is quarantined whole and recording goes on."""
    cyclic: list = []
    cyclic.append(cyclic)
    steps = [0]

    def on_schedule(so):
        steps[0] += 1
        if steps[0] == 4:
            so.kv_connector_metadata = cyclic

    h = scenarios.run("mixed", tiny_model, tmp_path, on_schedule=on_schedule, writer=writer)
    assert h.outputs == scenarios.run("mixed", tiny_model).outputs  # unrecorded
    (engine,) = open_trace(tmp_path).engines
    m = engine.manifest
    assert m["closed_cleanly"] is True and not m["recorder_errors"]
    quarantined = engine.read("malformed_steps").to_pylist()
    if writer == "process":
        assert [(r["step"], r["stage"]) for r in quarantined] == [(3, "snapshot"), (3, "update")]
        assert "cyclic" in quarantined[0]["error"]
        assert "kv_connector_metadata" in json.loads(quarantined[0]["plain_json"])
        assert 3 not in engine.read("steps").column("step").to_pylist()
    else:
        assert quarantined == []
