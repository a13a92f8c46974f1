"""The clean-run property of tests/query/test_fuzz_clean.py on recorded real engines: a sample
of the property test's generated workloads, played back to back on one real `LLM` per engine
mode (rig/workload_engine.py) into one recording, gives no error and no warning finding from the
catalog or the shadow worker. The modes put the recorder's real paths in the hunt: attach() on
an in-process engine, the batch queue of async scheduling, an ngram drafter, the priority
policy, and the plugin recording a multiprocess engine (engine core in a child process).

VLLM_CONTRACT_FUZZ_ENGINE_EXAMPLES workloads per mode (default 20; fixed seeds unless
VLLM_CONTRACT_FUZZ_EXAMPLES is set, as for the long profile of the property test). A failure
names the workload (its ops) that was playing at the failing step."""

from __future__ import annotations

import bisect
import gc
import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.replay.worker.shadow import run_shadow
from vllm_contract.rig.workload_engine import play_on_engine, workload_of
from vllm_contract.trace import open_trace

import live_child  # tests/: the environment of a child engine
from workloadkit import workloads

LONG = "VLLM_CONTRACT_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("VLLM_CONTRACT_FUZZ_ENGINE_EXAMPLES", "20"))

# One engine per mode: a small KV cache (12 blocks of 32 tokens: one request of the longest
# kind, so that the few requests of a workload preempt), a token budget under the longest
# prompts (chunked prefill), 32-token blocks so that the workloads' shared prefixes (32, 40, 64
# tokens) hit the prefix cache (the CPU attention backend takes multiples of 32 only;
# make_llm's kv_blocks counts 128-token blocks' worth of bytes)
BASE = dict(kv_blocks=3, block_size=32, max_num_batched_tokens=64, max_num_seqs=8,
            max_model_len=256)
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
         "prompt_lookup_min": 1}
MODES = {
    "sync": {},
    # The CPU platform turns async_scheduling off (vllm/platforms/cpu.py), so the flag alone
    # gives the plain Scheduler stepped one batch at a time: the AsyncScheduler is named, and
    # the engine core switched to step_with_batch_queue (two batches in flight), as an engine
    # with async scheduling (or pipeline parallelism) runs
    "async": dict(async_scheduling=True, scheduler_cls="AsyncScheduler"),
    "ngram": dict(speculative_config=NGRAM),
    "priority": dict(scheduling_policy="priority"),
    "multiprocess": {},
}
# Recorded by the plugin (VLLM_CONTRACT_TRACE_DIR) in a process of their own: mode ->
# VLLM_ENABLE_V1_MULTIPROCESSING. The ngram drafter imports numba, whose llvmlite library
# object answers any attribute, `__dict__` included; from then on every engine this process
# builds fails in vLLM's CPU kernel overrides (triton_utils/dispatcher.py `_rebind_kernels`:
# "'_lib_fn_wrapper' object has no attribute 'get'"), so the ngram engine runs elsewhere
CHILD = {"ngram": False, "multiprocess": True}


def sample(mode: str) -> list:
    """EXAMPLES generated workloads, their ops only (the engine's settings are the mode's);
    those of the priority mode drawn with priorities."""
    got = []
    strategy = workloads(batch_queue=1)
    if mode == "priority":
        strategy = strategy.filter(lambda w: w.policy == "priority")

    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(w):
        got.append(w.ops)

    if not LONG:  # a fixed sample per mode
        collect = seed(sorted(MODES).index(mode))(collect)
    collect()
    return got


# Drawn as the module is imported, before any engine: hypothesis also draws constants from the
# source of this project's modules loaded at the time (providers._get_local_constants), and an
# engine's recording loads more of them, which would change the later modes' samples
SAMPLES = {mode: sample(mode) for mode in MODES}


def engine_options(mode: str) -> dict:
    options = dict(BASE, **MODES[mode])
    if options.get("scheduler_cls") == "AsyncScheduler":
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        options["scheduler_cls"] = AsyncScheduler
    return options


def record_in_process(mode: str, model: str, trace, ops: list) -> tuple[int, list]:
    """Plays `ops` on an in-process engine under attach(); returns the engine.step() calls and
    the spans [(recorded steps so far, workload)] that on_step saw."""
    from vllm_contract.recorder import attach
    from vllm_contract.rig.engine import make_llm, scheduler_of

    llm = make_llm(model, **engine_options(mode))
    try:
        if mode == "async":
            live_child.use_batch_queue(llm)
        spans: list[tuple[int, int]] = []
        with attach(scheduler_of(llm), trace) as rec:
            steps = play_on_engine(llm.llm_engine, ops, tag_ids=True,
                                   on_step=lambda i: spans.append((rec.step, i)))
        return steps, spans
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def record_in_child(mode: str, model: str, trace, ops: list, tmp_path) -> None:
    """The same in a process of its own, recorded by the plugin (VLLM_CONTRACT_TRACE_DIR);
    VLLM_ENABLE_V1_MULTIPROCESSING as CHILD says (set before vLLM is imported): with it, the
    engine core runs in a child process of that one."""
    (tmp_path / "ops.json").write_text(json.dumps(ops))
    r = subprocess.run([sys.executable, "-m", "vllm_contract.rig.workload_engine", model,
                        str(tmp_path / "ops.json"), json.dumps(engine_options(mode))],
                       env=live_child.child_env(CHILD[mode], VLLM_CONTRACT_TRACE_DIR=trace),
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def coverage(e) -> dict:
    """What the recording holds of what the modes are there for."""
    scheduled = e.read("scheduled").to_pylist()
    return {
        "preempted": len(e.read("preempted")),
        "prefix_hits": sum(1 for r in scheduled if r["kind"] == "new"
                           and (r["num_computed_tokens"] or 0) > 0),
        "drafted": sum(1 for r in scheduled if r["spec_token_ids"]),
        "children": len({r["req_id"] for r in scheduled if r["req_id"][:1].isdigit()}),
        "priorities": sorted({r["priority"] for r in e.read("added").to_pylist()}),
        "aborted": sum(1 for r in e.read("finish_events").to_pylist()
                       if "ABORT" in (r["reason"] or "")),
    }


def scheduled_by(trace) -> dict[int, set[int]]:
    """Recorded step -> the workloads whose requests it scheduled (from their tagged ids)."""
    out: dict[int, set[int]] = {}
    for row in open_trace(trace).read("scheduled").select(["step", "req_id"]).to_pylist():
        i = workload_of(row["req_id"])
        if i is not None:
            out.setdefault(row["step"], set()).add(i)
    return out


def playing(step, req_id, spans, by_step) -> list[int]:
    """The workloads playing at a finding's step: its request's, else on_step's record of the
    step (in-process), else those the last step at or before it scheduled."""
    if req_id and workload_of(req_id) is not None:
        return [workload_of(req_id)]
    if step is None:
        return []
    if spans:
        k = bisect.bisect_right([c for c, _ in spans], step)
        if k < len(spans):
            return [spans[k][1]]
    before = [s for s in by_step if s <= step]
    return sorted(by_step[max(before)]) if before else []


@pytest.mark.parametrize("mode", list(MODES))
def test_generated_workloads_on_a_recorded_engine_are_clean(mode, tiny_model, tmp_path):
    ops = SAMPLES[mode]
    trace = tmp_path / "trace"
    t0 = time.time()
    spans: list = []
    if mode in CHILD:
        record_in_child(mode, tiny_model, trace, ops, tmp_path)
        calls = None
    else:
        calls, spans = record_in_process(mode, tiny_model, trace, ops)
    played = time.time() - t0
    (e,) = open_trace(trace).engines
    assert e.manifest["closed_cleanly"], e.manifest
    steps = len(e.read("steps"))
    with Gateway(trace) as gw:
        report = checker.run(gw, catalog.load())
    found = [f for f in report.findings + run_shadow(open_trace(trace))
             if f.severity in ("error", "warning")]
    cov = coverage(e)
    executor = (e.manifest.get("transport") or {}).get("executor")  # plugin recordings only
    scheduler = e.manifest["engine"]["scheduler_class"]
    print(f"{mode}: {len(ops)} workloads, {sum(map(len, ops))} ops, {steps} steps recorded "
          f"({calls} engine.step() calls), played in {played:.0f} s, checked in "
          f"{time.time() - t0 - played:.0f} s; {scheduler}, executor {executor}\n"
          f"  findings: {dict(Counter(f.invariant for f in report.findings))}; {cov}")
    assert not report.skipped, report.skipped
    if found:
        pytest.fail(f"{mode}: {len(found)} error/warning findings on a clean run of "
                    f"{scheduler}:\n" + describe(found, ops, spans, trace))
    # the mode ran what it is there for (preemptions are few, and where timing or sampled
    # tokens decide, not certain: printed only)
    assert cov["prefix_hits"] and cov["children"] and cov["aborted"], cov
    assert bool(cov["drafted"]) == (mode == "ngram"), cov
    assert (cov["priorities"] != [0]) == (mode == "priority"), cov
    assert scheduler.endswith("AsyncScheduler" if mode == "async" else ".Scheduler"), scheduler
    if mode == "multiprocess":  # the engine core's workers in processes of their own
        assert executor not in (None, "UniProcExecutor"), executor


def describe(found, ops, spans, trace) -> str:
    """Each finding (the first 10), and the ops of the workload playing at its step."""
    by_step = scheduled_by(trace)
    lines = []
    for f in found[:10]:
        lines.append(f"{f.invariant} ({f.severity}) at step {f.step}, {f.req_id}: {f.message}")
        for i in playing(f.step, f.req_id, spans, by_step):
            lines.append(f"    while workload {i} played: ops={ops[i]!r}")
    return "\n".join(lines)
