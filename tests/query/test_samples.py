"""The committed samples stay readable by this version and hold what samples/README.md says."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.trace import open_trace

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


CLEAN = ["mixed", "mixed-async", "spec-decode", "encoder-lookalike", "structured-output",
         "hybrid-sliding", "hybrid-mamba"]


@pytest.mark.parametrize("name", CLEAN)
def test_sample_opens_cleanly(name):
    result = CliRunner().invoke(app, ["info", str(SAMPLES / name)])
    assert result.exit_code == 0, result.stderr
    assert "integrity     OK" in result.stdout
    t = open_trace(SAMPLES / name)
    assert t.warnings == []
    assert not list((SAMPLES / name).rglob("*.arrows")), "samples are committed compacted"


def test_mixed_sample_has_preemption_and_aborts():
    t = open_trace(SAMPLES / "mixed")
    assert t.read("preempted").num_rows > 0
    reasons = t.read("finish_events")["reason"].to_pylist()
    assert "FINISHED_ABORTED" in reasons and "LENGTH" in reasons


@pytest.mark.parametrize("name,kinds", [("hybrid-sliding", ["sliding_window", "full"]),
                                        ("hybrid-mamba", ["mamba", "full"])])
def test_hybrid_samples_have_their_groups_and_what_makes_them_hybrid(name, kinds):
    """Recorded from real engines: the groups as the engine built them, and what a single
    group never shows: blocks a window left behind, handed on while their request runs."""
    from vllm_contract.replay.query.gateway import Gateway

    with Gateway(SAMPLES / name) as gw:
        assert gw.sql("SELECT kind FROM kv_groups ORDER BY grp").column(0).to_pylist() == kinds
        assert gw.sql("SELECT COUNT(*) FROM window_releases").column(0)[0].as_py() > 0
        assert gw.sql("SELECT COUNT(*) FROM preempted").column(0)[0].as_py() > 0
        # a released block later handed to another request, while its first holder still ran
        reused = gw.sql("""
            SELECT COUNT(*) FROM window_releases w
            JOIN group_grants g ON g.engine = w.engine AND g.step >= w.release_step
                 AND g.req_id <> w.req_id AND ARRAY_POSITION(g.ids, w.block_id) > 0
            JOIN lifeline l ON l.engine = w.engine AND l.req_id = w.req_id
                 AND (l.finished_step IS NULL OR l.finished_step > g.step)""")
        assert reused.column(0)[0].as_py() > 0


def test_spec_sample_has_drafts():
    assert any(t for t in open_trace(SAMPLES / "spec-decode").read("scheduled")["spec_token_ids"]
               .to_pylist())


@pytest.mark.parametrize("name,invariant", [
    ("broken-leak", "finished.leaked"),
    ("broken-held-block", "blocks.double_owner"),
    ("broken-unknown-cached", "lifecycle.unknown_cached"),
])
def test_broken_sample_shows_its_break(name, invariant):
    import json

    result = CliRunner().invoke(app, ["check", str(SAMPLES / name), "--format", "json"])
    assert result.exit_code == 1
    errors = {f["invariant"] for f in json.loads(result.stdout) if f["severity"] == "error"}
    assert invariant in errors


def test_async_sample_has_batches_in_flight():
    result = CliRunner().invoke(app, ["info", str(SAMPLES / "mixed-async")])
    assert "batches       up to 2 in flight" in result.stdout
    t = open_trace(SAMPLES / "mixed-async")
    # a finish whose id went out two steps later: the step after it was already scheduled
    events = {r["req_id"]: r["step"] for r in t.read("finish_events").to_pylist()}
    delivered = {r["req_id"]: r["step"] for r in t.read("finished").to_pylist()}
    assert any(delivered.get(rid) == step + 2 for rid, step in events.items())


@pytest.mark.parametrize("name", CLEAN)
def test_clean_sample_checks_clean(name):
    result = CliRunner().invoke(app, ["check", str(SAMPLES / name), "--fail-on", "warning"])
    assert result.exit_code == 0, result.stdout


def test_checks_side_by_side_find_what_one_at_a_time_finds():
    """The checker runs checks on two cursors at once: the same report as one after another,
    on every sample (the broken ones have findings of several checks)."""
    from vllm_contract.replay.query import catalog, checker
    from vllm_contract.replay.query.gateway import Gateway

    invs = catalog.load()
    for sample in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        with Gateway(sample) as a, Gateway(sample) as b:
            one, two = checker.run(a, invs, workers=1), checker.run(b, invs, workers=2)
        assert one == two, sample.name


def test_each_checks_columns_header_holds_on_every_sample():
    """A check's `-- columns:` header is what the checker requires of its query; a column it
    marks (NULL) is NULL in every row the query gives (broken samples give rows)."""
    from vllm_contract.replay.query import catalog
    from vllm_contract.replay.query.gateway import Gateway

    invs = catalog.load()
    assert all([n for n, _ in i.columns] == ["engine", "step", "req_id", "details"]
               for i in invs)
    rows = 0
    for sample in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        with Gateway(sample) as gw:
            for inv in invs:
                for name, null in inv.columns:
                    if null:
                        got = gw.sql(f"SELECT {name} FROM (\n{inv.sql}\n) WHERE {name} IS NOT NULL")
                        assert got.num_rows == 0, (inv.id, sample.name)
                rows += gw.sql(f"SELECT COUNT(*) AS n FROM (\n{inv.sql}\n)")["n"][0].as_py()
    assert rows > 0
