"""hypothesis strategies for rig/workloads.py's Workloads, and the clean-run property: a clean
run of the real scheduler gives no error or warning finding from the catalog or the shadow
worker. Shared by tests/query/test_fuzz_clean.py and bench/fuzz_clean_speed.py."""

from __future__ import annotations

import math
import tempfile

from hypothesis import strategies as st

from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.replay.worker.shadow import run_shadow
from vllm_contract.rig.workloads import GROUPS, Workload, play
from vllm_contract.trace import open_trace

# few names, so that ids are reused, re-added and re-aborted
NAMES = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def workloads(draw, batch_queue: int | None = None) -> Workload:
    block_size = draw(st.sampled_from([16, 32]))
    max_model_len = draw(st.sampled_from([64, 96, 128, 256]))
    spec = draw(st.sampled_from([0, 0, 1, 2, 3]))
    groups = draw(st.sampled_from(["full", "full", "full", "sliding", "mamba"]))
    # the longest request must fit the cache on its own, in every group, or it never runs
    per_request = len(GROUPS[groups] or [1]) * math.ceil((max_model_len + spec + 1) / block_size)
    num_blocks = draw(st.integers(per_request + 1, per_request * 4))
    # vLLM refuses a token budget below max_num_seqs; one below a request's drafts would never
    # schedule a decode with them
    seqs = draw(st.sampled_from([2, 4, 16]))
    budget = max(seqs, draw(st.sampled_from([spec + 8, 16, 32, 64, 256])))
    policy = draw(st.sampled_from(["fcfs", "priority"]))
    add = st.tuples(
        st.just("add"), NAMES, st.integers(0, 20),
        st.integers(1, max_model_len),                       # prompt length (cut below the limit)
        st.sampled_from([0, 0, block_size, 2 * block_size, 40]),  # shared prefix
        st.integers(1, max_model_len),                       # max_tokens: may reach the limit
        st.integers(0, 3) if policy == "priority" else st.just(0),
        st.sampled_from([1, 1, 1, 2, 3]))                    # n (parallel sampling)
    op = st.one_of(add, st.tuples(st.just("abort"), NAMES),
                   st.tuples(st.just("step"), st.integers(1, 8)))
    return Workload(
        ops=tuple(draw(st.lists(op, min_size=1, max_size=24))),
        num_blocks=num_blocks, block_size=block_size, max_num_batched_tokens=budget,
        max_num_seqs=seqs, max_model_len=max_model_len,
        enable_prefix_caching=groups == "mamba" or draw(st.booleans()),
        num_spec_tokens=spec,
        batch_queue=batch_queue or draw(st.sampled_from([1, 2])), policy=policy, groups=groups)


def serious_findings(w: Workload, model_dir: str, invariants=None) -> list[tuple]:
    """(invariant, step, req_id, message) of every error or warning the catalog and the shadow
    worker give on a recording of `w`."""
    with tempfile.TemporaryDirectory() as d:
        play(w, model_dir, d)
        with Gateway(d) as gw:
            report = checker.run(gw, invariants or catalog.load())
        found = report.findings + run_shadow(open_trace(d))
    return [(f.invariant, f.step, f.req_id, f.message) for f in found
            if f.severity in ("error", "warning")]
