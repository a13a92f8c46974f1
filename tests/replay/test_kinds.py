"""The registry of worker and replay finding kinds (core/kinds.py): complete for what the
workers report, pointing at real catalog checks, and the one rule that drops a worker finding
the catalog already made, as `check --worker shadow` applies it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from readerkit import invoke
from vllm_contract.kinds import CRASHES, KINDS, without_repeats
from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.replay.worker.shadow import run_shadow
from vllm_contract.trace import open_trace

ROOT = Path(__file__).resolve().parents[2]


def test_every_kind_a_worker_reports_is_registered_and_names_real_checks():
    worker = ROOT / "replay" / "worker"
    source = "\n".join(p.read_text() for p in [*sorted((worker / "shadow").glob("*.py")),
                                                *sorted(worker.glob("vllm_*.py"))])
    used = set(re.findall(r'"((?:worker|replay)\.[a-z_]+)"', source))
    assert used and used <= set(KINDS), used - set(KINDS)
    checks = {i.id for i in catalog.load()}
    assert not checks & set(KINDS)
    for k in KINDS.values():
        assert k.same_as is None or k.same_as in checks, k
        assert k.title and k.why and k.relies_on.startswith("vllm/")
    assert CRASHES == {"worker.unknown_cached", "worker.unknown_scheduled",
                       "worker.resumed_without_table", "worker.encoder_output_missing"}


def test_worker_findings_the_catalog_made_are_left_out_once_everywhere():
    """samples/broken-leak: the shadow worker's never_freed says what finished.leaked says,
    at the same step and request."""
    sample = ROOT / "samples" / "broken-leak"
    with Gateway(sample) as gw:
        cat = checker.run(gw, catalog.load()).findings
    worker = run_shadow(open_trace(sample))
    repeats = [w for w in worker if any(
        (c.engine, c.step, c.req_id, c.invariant) ==
        (w.engine, w.step, w.req_id, KINDS[w.invariant].same_as) for c in cat)]
    assert repeats, "the sample no longer has a repeated finding: the test proves nothing"
    merged = without_repeats(cat, worker)
    assert not any(r in merged for r in repeats)
    assert len(merged) == len(cat) + len(worker) - len(repeats)
    r = invoke("check", sample, "--worker", "shadow", "-f", "json")
    key = lambda d: (d["invariant"], d["engine"], d["step"], d["req_id"])  # noqa: E731
    assert sorted(map(key, json.loads(r.stdout))) == sorted(key(f.to_dict()) for f in merged)


def test_merged_findings_follow_one_of_the_two_orders_and_keep_a_steps_causes_first():
    """A report ranks by severity (what `check` prints); a walk goes by step and keeps, within a
    request's step, the order its worker said them in (the sort is stable)."""
    from vllm_contract.findings import RANK, by_severity, by_step

    sample = ROOT / "samples" / "broken-unknown-cached"
    with Gateway(sample) as gw:
        cat = checker.run(gw, catalog.load()).findings
    worker = run_shadow(open_trace(sample))
    walk = without_repeats(cat, worker)
    steps = [-1 if f.step is None else f.step for f in walk]
    assert len(set(steps)) > 1 and steps == sorted(steps)
    for a, b in zip(walk, walk[1:]):
        if (a.step, a.engine, a.req_id) == (b.step, b.engine, b.req_id):
            assert (cat + worker).index(a) < (cat + worker).index(b)
    ranked = without_repeats(cat, worker, key=by_severity)
    assert sorted(ranked, key=by_step) == walk
    ranks = [-RANK[f.severity] for f in ranked]
    assert ranks == sorted(ranks) and len(set(ranks)) > 1
    r = invoke("check", sample, "--worker", "shadow", "-f", "json")
    assert [d["invariant"] for d in json.loads(r.stdout)] == [f.invariant for f in ranked]
