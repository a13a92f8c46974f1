"""`reduce` on every scheduler-side break of rig/breaks.py beyond the one of the default suite
(tests/replay/test_reduce.py, rig/bugged.py IN_SUITE): each, as a vLLM Scheduler subclass
(rig/bugged.py COVERED), is recorded on its workload (60 requests, over a thousand steps; few
KV blocks where it needs preemption, batches in flight where it needs async scheduling, a
hybrid engine's KV cache groups for the hybrid breaks: a sliding-window or Mamba group beside a
full-attention one),
cut down to at most 3 requests and 10 % of the steps, with no finding the recording lacked;
the emitted pytest file, run where vllm_contract cannot be imported, fails with the subclass
and passes with vLLM's Scheduler. Run by `make reduce-all` (docs/reduce.md has the table of
the breaks left out)."""

from __future__ import annotations

import importlib
import sys

import pytest

from vllm_contract.replay.resim.record import catalog_findings
from vllm_contract.replay.resim.reduce import reduce
from vllm_contract.rig import bugged

import reducekit

MODULE = "long_reduce_bugs"
# the default suite reduces these (tests/replay/test_reduce.py)
NEW = [n for n in bugged.COVERED if n not in bugged.IN_SUITE]


@pytest.fixture(scope="module")
def bugs(tmp_path_factory):
    """The subclasses of every covered break, importable as long_reduce_bugs:Class."""
    root = tmp_path_factory.mktemp("reduce-all")
    specs = bugged.write(root, MODULE, list(bugged.COVERED))
    sys.path.insert(0, str(root))
    try:
        yield root, specs
    finally:
        sys.path.remove(str(root))


@pytest.mark.parametrize("name", NEW)
def test_break_is_reduced_to_a_pytest_file_that_fails_until_fixed(name, bugs, tiny_model,
                                                                   tmp_path):
    root, specs = bugs
    covered = bugged.COVERED[name]
    invariant = covered.invariant
    module, _, cls = specs[name].partition(":")
    steps = bugged.record_workload(getattr(importlib.import_module(module), cls), tiny_model,
                                   tmp_path / "rec", workload=covered.workload)
    assert steps >= 1000
    original = catalog_findings(tmp_path / "rec")
    assert invariant in {f.invariant for f in original}
    r = reduce(tmp_path / "rec", invariant, tmp_path / "out", scheduler_cls=specs[name])
    assert r.original_requests == 60 and r.original_steps == steps
    # the numbers of docs/reduce.md's table (`make reduce-all` shows them with -rP)
    print(f"{name}: {invariant}; requests {r.original_requests} -> {len(r.best.requests)}, "
          f"steps {steps:,} -> {r.best_steps:,}, {r.calls} re-simulations, {r.seconds:.0f} s")
    assert 1 <= len(r.best.requests) <= 3 and r.best_steps <= steps // 10
    assert r.stopped is None and r.calls >= 2
    found = {f.invariant for f in catalog_findings(r.trace)}
    assert invariant in found and found <= {f.invariant for f in original}
    assert not any(f.startswith("trace.") for f in found)
    assert r.pytest_file is not None, r.no_pytest
    assert "vllm_contract" not in r.pytest_file.read_text()
    failed = reducekit.run_emitted(r.pytest_file, VLLM_SCHEDULER_CLS=specs[name], PYTHONPATH=str(root))
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert " ".join(reducekit.why(invariant).split()) in " ".join(failed.stdout.split())
    passed = reducekit.run_emitted(r.pytest_file)
    assert passed.returncode == 0, passed.stdout[-3000:]


