"""Recording options for live engines, on the real Scheduler (harness): redacted prompts, a
maximum trace size, a bounded writer backlog (drop or block), and the manifest notes for each."""

from __future__ import annotations

import pytest

from vllm_contract import schema
from vllm_contract.recorder.rows import token_hash
from vllm_contract.replay.worker import canonical
from vllm_contract.replay.query.summary import summary
from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios


def _live(name, tiny_model, trace_dir, **options):
    live = []
    h = scenarios.run(name, tiny_model, trace_dir, on_schedule=lambda so: live.append(
        (canonical.from_live(so), {r.req_id: list(r.prompt_token_ids)
                                   for r in so.scheduled_new_reqs},
         {k: list(v) for k, v in so.scheduled_cached_reqs.all_token_ids.items()})), **options)
    return h, live


def test_redacted_prompts_keep_lengths_and_hashes_only(tiny_model, tmp_path):
    _, live = _live("mixed", tiny_model, tmp_path / "red", redact_prompts=True)
    e = open_trace(tmp_path / "red").engines[0]
    m = e.manifest
    assert m["redacted_prompts"] is True and m["worker_replayable"] is False
    assert m["redaction"]["fields"] == ["prompt_token_ids", "prefill_token_ids", "all_token_ids"]

    reqs = e.read("requests").to_pylist()
    assert reqs and all(r["prompt_token_ids"] is None for r in reqs)
    sched = e.read("scheduled").to_pylist()
    assert all(r["all_token_ids"] is None for r in sched)
    redacted = {(r["step"], r["req_id"], r["field"]): r for r in e.read("redacted").to_pylist()}

    want = {}
    for step, (_, prompts, all_tokens) in enumerate(live):
        for rid, ids in prompts.items():
            want[(step, rid, "prompt_token_ids")] = ids
        for rid, ids in all_tokens.items():
            want[(step, rid, "all_token_ids")] = ids
    assert any(k[2] == "all_token_ids" for k in want), "the scenario has no resumed request"
    assert set(redacted) == set(want)
    for key, ids in want.items():
        assert redacted[key]["length"] == len(ids)
        assert redacted[key]["sha256"] == token_hash(ids)
    by_req = {r["req_id"]: r["prompt_len"] for r in reqs}
    assert all(by_req[k[1]] == len(v) for k, v in want.items() if k[2] == "prompt_token_ids")

    # Everything else is what an unredacted recording holds.
    _live("mixed", tiny_model, tmp_path / "plain")
    plain = open_trace(tmp_path / "plain").engines[0]
    for table in ("steps", "finished", "preempted", "model_outputs", "finish_events"):
        a, b = e.read(table), plain.read(table)
        cols = [c for c in a.column_names if c != "t_ns" and not c.endswith("_ns")]
        assert a.select(cols).equals(b.select(cols)), table
    assert summary(open_trace(tmp_path / "red"))["engines"][0]["integrity"] == []


def test_max_trace_bytes_prunes_oldest_segments_and_records_the_gap(tiny_model, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("VLLM_CONTRACT_LONG_REQS", "64")
    monkeypatch.setenv("VLLM_CONTRACT_LONG_STEPS", "600")
    limit = 400_000
    scenarios.run("long_run", tiny_model, tmp_path, flush_steps=8, max_trace_bytes=limit)
    e = open_trace(tmp_path).engines[0]
    m = e.manifest
    assert m["closed_cleanly"] is True
    pruned = m["pruned_segments"]
    assert pruned and all(p["reason"] == "max_trace_bytes" for p in pruned)
    # What is on disk stays near the limit (the open segment may pass it by one flush).
    on_disk = sum(p.stat().st_size for t in schema.TABLE_NAMES
                  for p in schema.table_dir(e.dir, t).glob("*.arrows"))
    assert on_disk > 0
    assert on_disk <= limit + m["writer"]["segment_bytes"], on_disk
    # Steps kept + steps listed as dropped = every step, each exactly once.
    kept = e.read("steps")["step"].to_pylist()
    gaps = [s for a, b in m["dropped_steps"] for s in range(a, b + 1)]
    assert sorted(kept + gaps) == list(range(600))
    assert m["dropped_steps_total"] == len(gaps) > 0
    assert kept == list(range(kept[0], 600))  # the newest steps are the ones kept
    integrity = summary(open_trace(tmp_path))["engines"][0]["integrity"]
    # Deleted by the cap, not lost to a slow writer: the summary says which.
    capped = [i for i in integrity if "dropped" in i]
    assert capped and all("size cap" in i for i in capped), integrity


@pytest.mark.parametrize("on_full", ["drop", "block"])
def test_writer_backlog_is_bounded(tiny_model, tmp_path, monkeypatch, on_full):
    """A budget of one snapshot's worth: the writer (woken only every 64 steps or 1 s) is
    always behind. Dropping keeps memory bounded and says which steps are missing; blocking
    keeps every step."""
    monkeypatch.setenv("VLLM_CONTRACT_LONG_REQS", "32")
    monkeypatch.setenv("VLLM_CONTRACT_LONG_STEPS", "300")
    scenarios.run("long_run", tiny_model, tmp_path, max_pending_bytes=20_000, on_full=on_full)
    e = open_trace(tmp_path).engines[0]
    m = e.manifest
    kept = e.read("steps")["step"].to_pylist()
    gaps = [s for a, b in m["dropped_steps"] for s in range(a, b + 1)]
    assert sorted(kept + gaps) == list(range(300))
    if on_full == "block":
        assert gaps == [] and "dropped_steps_total" not in m
    else:
        assert gaps and m["dropped_steps_total"] == len(gaps)
        # No orphans: updates and model outputs only for steps that were kept.
        assert set(e.read("updates")["step"].to_pylist()) <= set(kept)
        assert set(e.read("model_outputs")["step"].to_pylist()) <= set(kept)
    assert m["closed_cleanly"] is True
