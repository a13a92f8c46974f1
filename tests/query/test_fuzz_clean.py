"""The clean-run property: any workload the real vLLM Scheduler or AsyncScheduler runs (random
arrivals, lengths, shared prefixes, aborts at every point of a request's life, id reuse,
priorities, n > 1, drafts, preemption under small caches, small token budgets, max_model_len
reached exactly, hybrid KV cache groups) records a trace on which the catalog and the shadow
worker report no error and no warning.

The suite runs a short, fixed-seed profile; `make fuzz-clean` runs the long one
(VLLM_CONTRACT_FUZZ_EXAMPLES per scheduler class, random seeds). A failure shrinks to a small
Workload: keep it in REGRESSIONS under a name that says what vLLM did."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from vllm_contract.replay.query import catalog
from vllm_contract.rig.workloads import Workload
from workloadkit import serious_findings, workloads

LONG = "VLLM_CONTRACT_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("VLLM_CONTRACT_FUZZ_EXAMPLES", "16"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None, database=None,
                   derandomize=not LONG, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.function_scoped_fixture])

# the minimal workloads the property test shrank its failures to, each once a false finding
REGRESSIONS = {
    # finished.duplicate: an id finished, added again and aborted before any step scheduled
    # it. vLLM frees that request too and delivers the id a second time, with no new request
    # in `requests` between the deliveries (only the input log's add shows it)
    "readded_aborted_before_it_ran": Workload(ops=(
        ("add", "a", 1, 20, 0, 3, 0, 1), ("step", 5), ("add", "a", 2, 20, 0, 3, 0, 1),
        ("abort", "a"), ("step", 3))),
    "readded_aborted_before_it_ran_async": Workload(batch_queue=2, ops=(
        ("add", "a", 1, 20, 0, 3, 0, 1), ("step", 2), ("abort", "a"),
        ("add", "a", 2, 20, 0, 3, 0, 1), ("abort", "a"), ("step", 3))),
    # blocks.double_owner: with two batches in flight, a step scheduled before the update that
    # finishes a request still grants it a block; the free in that update releases it, and the
    # pool hands it to another request a few steps on
    "block_granted_in_flight_after_finish": Workload(
        ops=(("add", "d", 17, 40, 32, 24, 1, 1), ("step", 5), ("add", "b", 0, 23, 32, 96, 1, 1)),
        num_blocks=10, max_num_batched_tokens=10, max_num_seqs=4, max_model_len=96,
        enable_prefix_caching=False, num_spec_tokens=2, batch_queue=2),
}


@pytest.fixture(scope="module")
def invariants():
    return catalog.load()


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression_workload_is_clean(name, tiny_model, invariants):
    assert serious_findings(REGRESSIONS[name], tiny_model, invariants) == []


@pytest.mark.parametrize("batch_queue", [1, 2], ids=["Scheduler", "AsyncScheduler"])
def test_generated_clean_runs_have_no_errors_or_warnings(batch_queue, tiny_model, invariants):
    @PROFILE
    @given(workloads(batch_queue=batch_queue))
    def clean(w):
        found = serious_findings(w, tiny_model, invariants)
        assert found == [], (w, found)

    clean()
