"""Real vLLM engines on tiny hybrid models (rig/hybrid_models.py): a sliding-window + full
attention Gemma 2 and a Mamba2 + attention GraniteMoeHybrid, each recorded once through a clean
greedy workload with prefix hits across a shared prefix longer than the window and than a
block, chunked prefill, preemption under a small KV cache and aborts (rig/hybrid_engine.py).
On each, every tool is exact: the manifest names the groups as the engine built them, `check`
and the shadow worker find no error and no warning, `resim` re-runs every step identically and
a real vLLM worker replays every token. The other hybrid models are `make hybrid`'s
(docs/hybrid.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_contract.trace import open_trace

CLI = str(Path(sys.executable).with_name("vllm-contract"))
# what each engine's KV cache groups must be, in vLLM's order
GROUPS = {"gemma2": ["sliding_window", "full"], "granite-hybrid": ["mamba", "full"]}


def _run(args, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def _serious(out: str) -> list[dict]:
    return [f for f in json.loads(out) if f["severity"] in ("error", "warning")]


@pytest.mark.parametrize("kind", sorted(GROUPS))
def test_hybrid_engine_every_tool_is_exact(kind, tiny_model, tmp_path):
    trace = tmp_path / kind
    rec = _run([sys.executable, "-m", "vllm_contract.rig.hybrid_engine", kind, str(trace)])
    assert rec.returncode == 0, rec.stderr[-3000:]
    (e,) = open_trace(trace).engines
    groups = e.manifest["engine"]["kv_cache_groups"]
    assert [g["kind"] for g in groups] == GROUPS[kind]
    # the workload reached what it is for: hits on the shared prefix, preemption, both groups
    # handed blocks in one grant
    sched = e.read("scheduled").to_pylist()
    assert any(r["kind"] == "new" and r["num_computed_tokens"] > 0 for r in sched)
    assert e.read("preempted").num_rows > 0
    assert any(r["new_block_ids"] and all(r["new_block_ids"]) for r in sched)
    if kind == "gemma2":  # the sliding group's hit tables begin with the null block
        assert any(r["kind"] == "new" and r["new_block_ids"][0][0] == 0 for r in sched)

    check = _run([CLI, "check", str(trace), "-f", "json"])
    assert check.returncode == 0 and _serious(check.stdout) == [], check.stdout[-3000:]
    shadow = _run([CLI, "check", str(trace), "--worker", "shadow", "-f", "json"])
    assert shadow.returncode == 0 and _serious(shadow.stdout) == [], shadow.stdout[-3000:]

    resim = _run([CLI, "resim", str(trace)])
    assert resim.returncode == 0, resim.stderr[-3000:]
    m = re.search(r"(\d+) of (\d+) steps identical", resim.stdout + resim.stderr)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) > 50, resim.stdout[-2000:]

    replay = _run([CLI, "replay", str(trace), "--worker", "vllm"])
    out = replay.stdout + replay.stderr
    assert replay.returncode == 0, out[-3000:]
    m = re.search(r"(\d+) of (\d+) step\(s\) replayed into a vLLM worker .*: (\d+) divergence",
                  out)
    assert m and m.group(1) == m.group(2) and m.group(3) == "0", out[-2000:]
