"""The example queries of docs/sql-views.md run on every sample, and answer what the reader
(pyarrow) computes from the same tables."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.replay.query.views import EXAMPLES
from vllm_contract.trace import open_trace

SAMPLES = sorted(p for p in (Path(__file__).resolve().parents[2] / "samples").iterdir()
                 if p.is_dir())
QUERIES = dict(EXAMPLES)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_example_runs_and_agrees_with_the_reader(sample):
    t = open_trace(sample)
    with Gateway(sample) as gw:
        got = {q: gw.sql(sql).to_pylist() for q, sql in EXAMPLES}
    pre = Counter((str(r["engine"]), r["req_id"]) for r in t.read("preempted").to_pylist())
    assert {(str(r["engine"]), r["req_id"]): r["preemptions"]
            for r in got["Preemptions by request"]} == dict(pre)
    budget = {e.name: (e.manifest.get("engine") or {}).get("max_num_batched_tokens")
              for e in t.engines}
    over = [(str(r["engine"]), r["step"]) for r in t.read("steps").to_pylist()
            if budget[r["engine"]] is not None
            and r["total_num_scheduled_tokens"] > budget[r["engine"]]]
    assert [(str(r["engine"]), r["step"]) for r in
            got["Steps that scheduled more tokens than the engine's budget"]] == sorted(over)
    slow = got["The slowest schedule() calls, with the queues they faced"]
    ns = sorted((r["schedule_ns"] for r in t.read("steps").to_pylist()), reverse=True)[:10]
    assert [round(r["schedule_ms"] * 1e6) for r in slow] == ns
