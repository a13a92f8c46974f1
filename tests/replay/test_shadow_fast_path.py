"""The shadow worker's fast path (numpy-prepared steps that touch only what changes) reaches the
same findings and state as its full step code at every position, on every committed sample, on
real harness scenarios and on a generated long trace where nearly every step is fast."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from vllm_contract.replay.worker.shadow import ShadowModel
from vllm_contract.rig import scenarios
from vllm_contract.trace import open_trace

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"


def _slow(engine, **kw) -> ShadowModel:
    w = ShadowModel(engine, **kw)
    w._fast = lambda *a: False  # every step through the full step code
    return w


def _assert_same(engine, checkpoint_every: int = 256) -> int:
    """Steps the fast path took."""
    fast = ShadowModel(engine, checkpoint_every=checkpoint_every)
    taken = [0]
    real = fast._fast

    def counted(*a):
        ok = real(*a)
        taken[0] += bool(ok)
        return ok

    fast._fast = counted
    slow = _slow(engine, checkpoint_every=checkpoint_every)
    for _ in fast.steps:
        assert fast.step() == slow.step(), f"findings differ at position {slow.s.pos}"
        assert fast.state() == slow.state(), f"state differs at position {slow.s.pos}"
    assert fast.finish() == slow.finish()
    rng = random.Random(0)
    for pos in rng.sample(range(len(fast.steps) + 1), min(12, len(fast.steps) + 1)):
        fast.goto(pos)
        slow.goto(pos)
        assert fast.state() == slow.state(), f"goto {pos}"
    return taken[0]


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.iterdir() if p.is_dir()))
def test_samples(sample):
    for engine in open_trace(SAMPLES / sample).engines:
        _assert_same(engine, checkpoint_every=7)


@pytest.mark.parametrize("name", ["preemption", "id_reuse", "spec_decode", "mixed"])
def test_harness_scenarios(name, tiny_model, tmp_path):
    scenarios.run(name, tiny_model, tmp_path)
    (engine,) = open_trace(tmp_path).engines
    assert _assert_same(engine, checkpoint_every=16) > 0


def test_generated_long_trace(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import gen_trace

    gen_trace.generate(tmp_path / "t", 3000, 8, 1000)
    (engine,) = open_trace(tmp_path / "t").engines
    assert _assert_same(engine) > 2500  # nearly every step: the fast path is what is compared
