"""Opaque objects: described, never executed on read; pickled only behind two opt-ins.

kv_connector_metadata is stamped onto real SchedulerOutputs (a LOOK-ALIKE: the CPU run has no KV
connector, so the installed vLLM cannot produce that field here)."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from vllm_contract.errors import TraceError
from vllm_contract.recorder import attach
from vllm_contract.opaque import load_pickled
from vllm_contract.trace import open_trace
from vllm_contract.rig.harness import Harness
from vllm_contract.rig.scenarios import prompt


def _record(tiny_model, out, **options):
    h = Harness(tiny_model)
    real = h.scheduler.schedule

    def schedule(*a, **kw):
        so = real(*a, **kw)
        so.kv_connector_metadata = Fraction(h.steps + 1, 3)
        return so

    h.scheduler.schedule = schedule
    with attach(h.scheduler, out, **options):
        h.add("r", prompt(1, 20), max_tokens=3)
        h.run()
    return open_trace(out).engines[0]


def test_opaque_is_described_not_pickled_by_default(tiny_model, tmp_path):
    e = _record(tiny_model, tmp_path)
    rows = [r for r in e.read("extra_fields").to_pylist() if r["field"] == "kv_connector_metadata"]
    assert len(rows) == e.read("steps").num_rows
    assert rows[0]["type_name"] == "fractions.Fraction"
    assert json.loads(rows[0]["value_json"])["__opaque__"] == "fractions.Fraction"
    assert all(r["pickled"] is None for r in rows)
    assert e.manifest["pickled_opaque"] is False
    with pytest.raises(TraceError, match="no pickled payload"):
        load_pickled(rows[0], allow_pickle=True)


def test_pickled_payload_needs_the_second_opt_in(tiny_model, tmp_path):
    e = _record(tiny_model, tmp_path, pickle_opaque=True)
    rows = sorted((r for r in e.read("extra_fields").to_pylist()
                   if r["field"] == "kv_connector_metadata"), key=lambda r: r["step"])
    assert e.manifest["pickled_opaque"] is True
    with pytest.raises(TraceError, match="refusing to unpickle"):
        load_pickled(rows[0])
    assert [load_pickled(r, allow_pickle=True) for r in rows] == [
        Fraction(i + 1, 3) for i in range(len(rows))]
