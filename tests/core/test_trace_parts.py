"""EngineTrace.parts, the one walk of a table's rows a segment at a time: what read() joins,
segment by segment in stored order, with `columns` read alone as read() reads them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from vllm_contract import schema
from vllm_contract.trace import open_trace

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def test_parts_are_the_table_a_segment_at_a_time():
    (engine,) = open_trace(SAMPLES / "mixed").engines
    for table in schema.TABLE_NAMES:
        parts = list(engine.parts(table))
        assert len(parts) <= len(engine.segments(table))
        whole = engine.read(table)
        if parts:
            assert pa.concat_tables(parts).equals(whole), table
        else:
            assert whole.num_rows == 0
    steps = list(engine.parts("steps", ["step", "t_ns"]))
    assert steps and all(p.column_names == ["step", "t_ns"] for p in steps)
    assert pa.concat_tables(steps).equals(engine.read("steps", ["step", "t_ns"]))
