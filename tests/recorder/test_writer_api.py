"""One interface for both writers (writer_api.py), and the queue's records (records.py) on both
queues."""

from __future__ import annotations

import importlib
import inspect

import pytest

from vllm_contract.recorder import handoff, records
from vllm_contract.recorder.writer import TraceWriter
from vllm_contract.recorder.writer_api import Writer
from vllm_contract.recorder.writer_proc import ProcessWriter


def _members(cls: type) -> list[str]:
    return [n for n in dir(cls) if not n.startswith("_")]


@pytest.mark.parametrize("cls", [TraceWriter, ProcessWriter])
def test_each_writer_answers_every_call_of_the_interface(cls):
    """The same names and, for each method, the interface's parameters in its order (a writer
    may add optional ones after them)."""
    for name in _members(Writer):
        ours = getattr(Writer, name)
        theirs = getattr(cls, name, None)
        if isinstance(ours, property):
            # A property, or an attribute the writer sets in __init__.
            assert (isinstance(theirs, property)
                    or f"self.{name} =" in inspect.getsource(cls.__init__)), name
            continue
        assert callable(theirs), f"{cls.__name__} has no {name}()"
        want = list(inspect.signature(ours).parameters.values())
        got = list(inspect.signature(theirs).parameters.values())
        assert [p.name for p in got[:len(want)]] == [p.name for p in want], name
        assert all(p.default is not p.empty or p.kind is p.VAR_KEYWORD
                   for p in got[len(want):]), name
    assert "dir" in Writer.__annotations__


def test_the_recorder_never_asks_which_writer_it_has():
    src = "".join(inspect.getsource(importlib.import_module(f"vllm_contract.recorder.{m}"))
                  for m in ("attach", "armed", "plugin"))  # the modules, not attach()
    assert "def record_schedule" in src
    for word in (".raw", "isinstance(self.writer", "ProcessWriter)", "TraceWriter)"):
        assert word not in src


def test_records_cross_the_ring_as_themselves():
    """What the engine side encodes is decoded as the same record, read by field name; on the
    ring it is plain data (no class is named by the bytes)."""
    enc = handoff.Encoder()
    sched = records.Schedule(3, 10, 20, (1, 2, 0.5), {"x": [1, 2]})
    back = handoff.decode_record(enc.encode_record(sched))
    assert type(back) is records.Schedule and back == sched and back.cost == 0
    assert b"records" not in enc.encode_record(sched)
    for item in (records.STOP, records.Flush(4), records.Dropped([1, 2]),
                 records.Init("/d", {"m": 1}, {"o": 2}, {"f": 3}), records.Error("E: x", 1.5),
                 records.Manifest({"k": 1}), records.Transport(2, [(1, 2)]),
                 records.Finish(1, 5, "finish_requests", [("r", "FINISHED_ABORTED")]),
                 records.Update(1, 2, 3, b"bytes", (), ()),
                 records.Malformed(1, None, "snapshot", "E: x", {"a": 1})):
        for data in (enc.encode_record(item), handoff.encode_control(item)):
            back = handoff.decode_record(data)
            assert type(back) is type(item) and back == item


def test_every_record_the_writer_process_sends_has_a_kind_on_the_ring():
    assert set(records.RING_RECORDS) >= {
        records.Schedule, records.Update, records.Finish, records.Transport, records.Malformed,
        records.Manifest, records.Error, records.Stop, records.Init, records.Flush,
        records.Dropped}
    with pytest.raises(KeyError):
        handoff.encode_control(records.Barrier(None))  # a thread's Event never crosses
