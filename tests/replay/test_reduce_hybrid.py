"""`reduce` on a hybrid engine (several KV cache groups: vLLM's own Mamba and full-attention
managers, no mocks). A hybrid break of rig/breaks.py, as a Scheduler subclass (rig/bugged.py
COVERED, on its hybrid workload), is recorded and cut down to at most 3 requests and 10 % of
the steps; the reduced trace still has the finding and none the original lacked; the emitted
pytest file rebuilds the recorded groups with vLLM's API alone and, run where vllm_contract
cannot be imported, fails with the subclass and passes with vLLM's Scheduler. The other hybrid
breaks are reduced by `make reduce-all` (long/test_reduce_breaks.py), on 60 requests."""

from __future__ import annotations

import importlib
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from vllm_contract.replay.resim.record import catalog_findings
from vllm_contract.replay.resim.reduce import reduce
from vllm_contract.rig import bugged

import reducekit

MODULE = "reduce_hybrid_bugs"
# the fastest of the hybrid breaks to reduce: it needs one request (a running request's Mamba
# state written to the null block once its decode crosses a block boundary)
NAME = "null_block_in_table"
# fewer requests than make reduce-all's 60 (181 steps, not 1,223: a default-suite test of under
# two minutes on 2 busy cores); the bounds are the same
REQUESTS = 8


@pytest.fixture(scope="module")
def bug(tmp_path_factory):
    """The break's subclass, importable as reduce_hybrid_bugs:Class; its folder and name."""
    root = tmp_path_factory.mktemp("reduce-hybrid")
    spec = bugged.write(root, MODULE, [NAME])[NAME]
    sys.path.insert(0, str(root))
    try:
        yield root, spec
    finally:
        sys.path.remove(str(root))


def test_hybrid_break_is_reduced_to_a_pytest_file_that_fails_until_fixed(bug, tiny_model,
                                                                         tmp_path):
    root, spec = bug
    covered = bugged.COVERED[NAME]
    invariant, workload = covered.invariant, covered.workload
    assert len(workload.groups) == 2 and workload.groups[0]["spec"] == "MambaSpec"
    module, _, cls = spec.partition(":")
    steps = bugged.record_workload(getattr(importlib.import_module(module), cls), tiny_model,
                                   tmp_path / "rec", requests=REQUESTS, workload=workload)
    assert steps >= 150
    original = catalog_findings(tmp_path / "rec")
    assert invariant in {f.invariant for f in original}
    r = reduce(tmp_path / "rec", invariant, tmp_path / "out", scheduler_cls=spec)
    assert r.original_requests == REQUESTS and r.original_steps == steps
    assert 1 <= len(r.best.requests) <= 3 and r.best_steps <= steps // 10
    assert r.stopped is None and r.calls >= 2
    # the reduced trace is a hybrid trace: the catalog finds the finding again, and nothing new
    found = {f.invariant for f in catalog_findings(r.trace)}
    assert invariant in found and found <= {f.invariant for f in original}
    assert not any(f.startswith("trace.") for f in found)
    # the standalone pytest file builds the recorded Mamba and full-attention groups
    assert r.pytest_file is not None, r.no_pytest
    text = r.pytest_file.read_text()
    assert "vllm_contract" not in text
    assert "kvi.MambaSpec(" in text and "kvi.FullAttentionSpec(" in text
    assert "MAMBA_CACHE_MODE = 'align'" in text
    # the two runs side by side (each is mostly vLLM's import)
    with ThreadPoolExecutor(2) as pool:
        bugged_run = pool.submit(reducekit.run_emitted, r.pytest_file, VLLM_SCHEDULER_CLS=spec,
                                 PYTHONPATH=str(root))
        stock_run = pool.submit(reducekit.run_emitted, r.pytest_file)
        failed, passed = bugged_run.result(), stock_run.result()
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert " ".join(reducekit.why(invariant).split()) in " ".join(failed.stdout.split())
    assert passed.returncode == 0, passed.stdout[-3000:]
