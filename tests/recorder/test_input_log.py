"""The input log (tables `inputs` and `added`): every call that fed the real scheduler, each in
its exact place among all the scheduler's calls, with the Request fields it was given."""

from __future__ import annotations

import pytest

from vllm_contract import schema
from vllm_contract.rig.harness import Harness, HarnessConfig
from vllm_contract.rig.scenarios import prompt
from vllm_contract.recorder import attach
from vllm_contract.trace import open_trace

_SPIED = ("schedule", "update_from_output", "add_request", "finish_requests",
          "update_draft_token_ids")


def _spy(scheduler) -> list[tuple[str, object]]:
    """Every call the test makes on the scheduler, in order: an instance-level wrapper put on
    before attach(), so the recorder wraps it and its originals are these."""
    calls: list[tuple[str, object]] = []
    for name in _SPIED:
        original = getattr(scheduler, name)

        def wrapper(*a, _name=name, _original=original, **kw):
            calls.append((_name, a[0] if a else None))
            return _original(*a, **kw)

        setattr(scheduler, name, wrapper)
    return calls


def _drive(h: Harness) -> None:
    """Adds before and between steps, an abort of a running and of a queued request, an abort
    of an id the scheduler never had, two batches of drafts (spec decode)."""
    h.add("r0", prompt(0, 40), max_tokens=6, priority=2)
    h.add("r1", prompt(1, 70), max_tokens=6)
    h.step()
    h.add("r2", prompt(2, 30), max_tokens=4, cache_salt="tenant-a")
    h.step()
    h.step()
    h.add("queued", prompt(3, 20), max_tokens=2)
    h.abort("r1", "queued", "no-such-id")
    while h.busy:
        h.step()


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_every_input_call_is_logged_in_its_place(tiny_model, tmp_path, writer):
    h = Harness(tiny_model, HarnessConfig(num_spec_tokens=2))
    calls = _spy(h.scheduler)
    with attach(h.scheduler, tmp_path, writer=writer):
        _drive(h)
    e = open_trace(tmp_path).engines[0]
    assert e.manifest["format_version"] == schema.FORMAT_VERSION >= schema.INPUTS_FORMAT
    assert e.manifest["input_log"]["prompt_block_hashes"] is None
    rows = e.read("inputs").to_pylist()
    # seq is each call's index among every call the scheduler got (rows of a call share it)
    for r in rows:
        name, arg = calls[r["seq"]]
        assert name == r["call"], r
        schedules = sum(1 for n, _ in calls[:r["seq"]] if n == "schedule")
        updates = sum(1 for n, _ in calls[:r["seq"]] if n == "update_from_output")
        assert (r["step"], r["updates"]) == (schedules - 1, updates), r
    logged = {r["seq"] for r in rows}
    inputs = [i for i, (n, _) in enumerate(calls) if n not in ("schedule", "update_from_output")]
    assert sorted(logged) == inputs  # none missed, none made up

    adds = [r for r in rows if r["call"] == "add_request"]
    assert [r["req_id"] for r in adds] == ["r0", "r1", "r2", "queued"]
    added = {r["req_id"]: r for r in e.read("added").to_pylist()}
    for seq, (name, req) in enumerate(calls):
        if name != "add_request":
            continue
        a = added[req.request_id]
        assert a["seq"] == seq
        assert a["prompt_token_ids"] == list(req.prompt_token_ids)
        assert a["num_prompt_tokens"] == req.num_prompt_tokens
        assert a["arrival_time"] == req.arrival_time
        assert a["priority"] == req.priority
        assert a["cache_salt"] == req.cache_salt
        assert a["prompt_block_hashes"] is None
    assert added["r0"]["priority"] == 2 and added["r2"]["cache_salt"] == "tenant-a"
    assert '"max_tokens":6' in added["r0"]["sampling_params"]

    aborts = [r for r in rows if r["call"] == "finish_requests"]
    assert len({r["seq"] for r in aborts}) == 1
    assert {r["req_id"]: (r["finished"], r["status"]) for r in aborts} == {
        "r1": (True, "FINISHED_ABORTED"), "queued": (True, "FINISHED_ABORTED"),
        "no-such-id": (False, "FINISHED_ABORTED")}
    # the ids vLLM finished first, in the order it took them (the finish events' order)
    events = [r["req_id"] for r in e.read("finish_events").to_pylist()
              if r["source"] == "finish_requests"]
    assert [r["req_id"] for r in sorted(aborts, key=lambda r: r["pos"])][:2] == events

    drafts = [r for r in rows if r["call"] == "update_draft_token_ids" and r["req_id"]]
    given = [(rid, list(toks)) for n, d in calls if n == "update_draft_token_ids"
             for rid, toks in zip(d.req_ids, d.draft_token_ids)]
    assert len(drafts) == len(given) > 0
    # as given, before vLLM's validation could trim them
    assert sorted((r["req_id"], r["token_ids"]) for r in drafts) == sorted(given)


def test_redacted_prompts_log_salted_block_hashes(tiny_model, tmp_path):
    """Redacted: no prompt tokens and no cache salt, but each full prompt block's hash,
    salted per recording: equal prefixes stay equal, nothing matches vLLM's own hashes."""
    shared = prompt(7, 64)
    hashes = []
    for run in ("a", "b"):
        h = Harness(tiny_model)
        with attach(h.scheduler, tmp_path / run, redact_prompts=True):
            first = h.add("p0", shared + prompt(8, 20), max_tokens=2)
            h.add("p1", shared + prompt(9, 40), max_tokens=2, cache_salt="s")
            while h.busy:
                h.step()
        e = open_trace(tmp_path / run).engines[0]
        assert e.manifest["input_log"]["prompt_block_hashes"]
        rows = {r["req_id"]: r for r in e.read("added").to_pylist()}
        for r in rows.values():
            assert r["prompt_token_ids"] is None and r["cache_salt"] is None
            assert len(r["prompt_block_hashes"]) == r["num_prompt_tokens"] // 16
        p0, p1 = rows["p0"]["prompt_block_hashes"], rows["p1"]["prompt_block_hashes"]
        assert len(p0) == 5 and len(set(p0)) == 5
        assert not set(p0) & {bytes(b) for b in first.block_hashes}
        hashes.append(p0)
        # p1's salt changes every block's hash, as it changes vLLM's
        assert not set(p0) & set(p1)
    assert not set(hashes[0]) & set(hashes[1])  # another recording, another salt


def test_shared_prefix_hashes_are_equal_when_redacted(tiny_model, tmp_path):
    shared = prompt(7, 64)
    h = Harness(tiny_model)
    with attach(h.scheduler, tmp_path, redact_prompts=True):
        h.add("p0", shared + prompt(8, 20), max_tokens=2)
        h.add("p1", shared + prompt(9, 40), max_tokens=2)
        while h.busy:
            h.step()
    rows = {r["req_id"]: r for r in open_trace(tmp_path).engines[0].read("added").to_pylist()}
    p0, p1 = rows["p0"]["prompt_block_hashes"], rows["p1"]["prompt_block_hashes"]
    assert p0[:4] == p1[:4] and p0[4] != p1[4]


def test_requests_queued_before_the_recording_are_logged_as_added(tiny_model, tmp_path):
    h = Harness(tiny_model)
    h.add("early", prompt(1, 30), max_tokens=2)
    with attach(h.scheduler, tmp_path):
        h.add("late", prompt(2, 30), max_tokens=2)
        while h.busy:
            h.step()
    e = open_trace(tmp_path).engines[0]
    assert [(r["seq"], r["req_id"]) for r in e.read("added").to_pylist()] == [
        (0, "early"), (1, "late")]
