"""Diff tests of the token-count checks (tokens.*): tiny traces that break or just keep vLLM's
contract on num_scheduled_tokens and the lists it must match, with the exact rows each check
must return.

The look-alike engine has max_model_len 64 and a budget of 32 tokens (tinytrace.SETTINGS).
Unless a test says otherwise, a request's prompt is prefilled whole in its first step and then
decodes one token a step: a cached row's num_output_tokens counts the tokens sampled so far."""

from __future__ import annotations

import tinytrace as tt


def intro(step, rid, prompt_len, pos=0):
    """The NewRequestData row that introduces `rid`."""
    return {"step": step, "req_id": rid, "pos": pos, "prompt_len": prompt_len,
            "prompt_token_ids": list(range(100, 100 + prompt_len))}


def new(step, rid, sched, pos=0):
    return {"step": step, "req_id": rid, "kind": "new", "pos": pos, "resumed": False,
            "num_computed_tokens": 0, "num_scheduled_tokens": sched}


def cached(step, rid, computed, sched, outputs, pos=0, **more):
    return {"step": step, "req_id": rid, "kind": "cached", "pos": pos, "resumed": False,
            "num_computed_tokens": computed, "num_scheduled_tokens": sched,
            "num_output_tokens": outputs, **more}


def resumed(step, rid, computed, sched, outputs, pos=0):
    return {**cached(step, rid, computed, sched, outputs, pos), "kind": "resumed",
            "resumed": True}


def write(tmp_path, scheduled, steps=None, settings=None, manifest=None, **tables):
    """The trace of these rows over steps 0..the last listed one; unless `steps` is given, each
    step's total is the sum of its rows' tokens and its counts those of its lists. `settings`
    and `manifest` go to tinytrace.write."""
    def row(i):
        rows = [r for r in scheduled if r["step"] == i]
        return {"step": i,
                "total_num_scheduled_tokens": sum(r.get("num_scheduled_tokens") or 0
                                                  for r in rows),
                "num_new": sum(r.get("kind") == "new" for r in rows),
                "num_cached": sum(r.get("kind") in ("cached", "resumed") for r in rows),
                "num_finished": sum(f["step"] == i for f in tables.get("finished", []))}
    if steps is None:
        steps = [row(i) for i in range(1 + max(r["step"] for r in scheduled))]
    return tt.write(tmp_path, {"steps": steps, "scheduled": scheduled, **tables},
                    settings=settings, **(manifest or {}))


# --- tokens.nonpositive ------------------------------------------------------------------------

def _decode_then(tmp_path, a_tokens, b_tokens):
    # a (prompt 8) and b (prompt 4, from step 1) decode; step 2 gives them these counts
    write(tmp_path, [new(0, "a", 8),
                     cached(1, "a", 8, 1, 1), new(1, "b", 4),
                     cached(2, "a", 9, a_tokens, 2), cached(2, "b", 4, b_tokens, 1, pos=1)],
          requests=[intro(0, "a", 8), intro(1, "b", 4)])


def test_nonpositive_zero_and_negative_counts(tmp_path):
    """A listed request given 0 tokens (vLLM lists only requests it gives at least one) and
    one given a negative count: each row is reported with its count."""
    _decode_then(tmp_path, a_tokens=0, b_tokens=-3)
    assert tt.found(tmp_path, "tokens.nonpositive") == [
        (2, "a", "num_scheduled_tokens = 0"), (2, "b", "num_scheduled_tokens = -3")]


def test_nonpositive_one_token_each(tmp_path):
    """Near miss: the same step giving each decoding request its one token."""
    _decode_then(tmp_path, a_tokens=1, b_tokens=1)
    assert tt.found(tmp_path, "tokens.nonpositive") == []


# --- tokens.total_mismatch ---------------------------------------------------------------------

def _two_requests_then_idle(tmp_path, totals):
    # a (8) and b (4, from step 1) decode until both finish by length in step 2's update;
    # step 3 schedules nothing and only delivers their finished ids
    write(tmp_path, [new(0, "a", 8),
                     cached(1, "a", 8, 1, 1), new(1, "b", 4),
                     cached(2, "a", 9, 1, 2), cached(2, "b", 4, 1, 1, pos=1)],
          steps=[{"step": i, "total_num_scheduled_tokens": t} for i, t in enumerate(totals)],
          requests=[intro(0, "a", 8), intro(1, "b", 4)],
          finish_events=[{"step": 2, "req_id": r, "reason": "LENGTH",
                          "source": "update_from_output"} for r in ("a", "b")],
          finished=[{"step": 3, "req_id": "a"}, {"step": 3, "req_id": "b"}])


def test_total_mismatch_step_total_off_by_one(tmp_path):
    """SchedulerOutput.total_num_scheduled_tokens must be the sum of num_scheduled_tokens: step
    1 sums 1 + 4 = 5 but says 6, and step 3, which lists nobody, says 1 (its sum is 0)."""
    _two_requests_then_idle(tmp_path, totals=[8, 6, 2, 1])
    assert tt.found(tmp_path, "tokens.total_mismatch") == [
        (1, None, "total 6 != sum 5"), (3, None, "total 1 != sum 0")]


def test_total_mismatch_totals_agree(tmp_path):
    """Near miss: every total the sum of its step's counts, the idle step's total 0."""
    _two_requests_then_idle(tmp_path, totals=[8, 5, 2, 0])
    assert tt.found(tmp_path, "tokens.total_mismatch") == []


# --- tokens.listed_without_tokens --------------------------------------------------------------

def _entries(tmp_path, b_new_tokens, a_step2_tokens):
    write(tmp_path, [new(0, "a", 8),
                     cached(1, "a", 8, 1, 1), new(1, "b", b_new_tokens),
                     cached(2, "a", 9, a_step2_tokens, 2)],
          requests=[intro(0, "a", 8), intro(1, "b", 4)])


def test_listed_without_tokens_new_and_cached(tmp_path):
    """A new request (b, step 1) and a cached one (a, step 2) in the step's lists with no
    num_scheduled_tokens entry: the worker's lookup of their count fails."""
    _entries(tmp_path, b_new_tokens=None, a_step2_tokens=None)
    assert tt.found(tmp_path, "tokens.listed_without_tokens") == [
        (1, "b", "new request without a num_scheduled_tokens entry"),
        (2, "a", "cached request without a num_scheduled_tokens entry")]


def test_listed_without_tokens_every_entry_present(tmp_path):
    """Near miss: the same lists, each request with its entry."""
    _entries(tmp_path, b_new_tokens=4, a_step2_tokens=1)
    assert tt.found(tmp_path, "tokens.listed_without_tokens") == []


# --- tokens.unlisted_request -------------------------------------------------------------------

def _b_in_step_1(tmp_path, b_row):
    write(tmp_path, [new(0, "a", 8), new(0, "b", 4, pos=1), cached(1, "a", 8, 1, 1), b_row],
          requests=[intro(0, "a", 8), intro(0, "b", 4, pos=1)])


def test_unlisted_request_count_without_a_list_entry(tmp_path):
    """b, running since step 0, gets 1 token in step 1's num_scheduled_tokens but is left out
    of scheduled_cached_reqs: the worker gets a count for a request it is not told about."""
    _b_in_step_1(tmp_path, {"step": 1, "req_id": "b", "num_scheduled_tokens": 1})
    assert tt.found(tmp_path, "tokens.unlisted_request") == [
        (1, "b", "in num_scheduled_tokens (1) but in neither scheduled_new_reqs nor "
                 "scheduled_cached_reqs")]


def test_unlisted_request_listed_as_cached(tmp_path):
    """Near miss: the same count with b in scheduled_cached_reqs."""
    _b_in_step_1(tmp_path, cached(1, "b", 4, 1, 1, pos=1))
    assert tt.found(tmp_path, "tokens.unlisted_request") == []


# --- tokens.duplicate_request ------------------------------------------------------------------

def test_duplicate_request_cached_twice(tmp_path):
    """a is listed twice in step 2's scheduled_cached_reqs (positions 0 and 1): the worker would
    update one request's state twice."""
    write(tmp_path, [new(0, "a", 8), cached(1, "a", 8, 1, 1),
                     cached(2, "a", 9, 1, 2), cached(2, "a", 9, 1, 2, pos=1)],
          requests=[intro(0, "a", 8)])
    assert tt.found(tmp_path, "tokens.duplicate_request") == [
        (2, "a", "listed 2 times (cached, cached)")]


def test_duplicate_request_new_entry_for_a_cached_id(tmp_path):
    """a is still cached in step 2 when a new request with its id is introduced in the same
    step: two batch rows for one id."""
    write(tmp_path, [new(0, "a", 8), cached(1, "a", 8, 1, 1),
                     new(2, "a", 8), cached(2, "a", 9, 1, 2)],
          requests=[intro(0, "a", 8), intro(2, "a", 8)])
    # STRING_AGG has no ORDER BY in the check: the kinds may come in either order
    assert tt.found(tmp_path, "tokens.duplicate_request") in (
        [(2, "a", "listed 2 times (new, cached)")], [(2, "a", "listed 2 times (cached, new)")])


def test_duplicate_request_each_id_once(tmp_path):
    """Near miss: step 2 lists a once and introduces another request, b, beside it."""
    write(tmp_path, [new(0, "a", 8), cached(1, "a", 8, 1, 1),
                     new(2, "b", 8), cached(2, "a", 9, 1, 2)],
          requests=[intro(0, "a", 8), intro(2, "b", 8)])
    assert tt.found(tmp_path, "tokens.duplicate_request") == []


# --- tokens.beyond_model_len -------------------------------------------------------------------

def _long_prompt(tmp_path, last_step, settings=None):
    # a's prompt of 62 is prefilled in two chunks (budget 32), then a decodes one token a step
    # (its end: 64 after step 3, 65 after step 4); b, short, decodes beside it from step 2
    rows = [new(0, "a", 32),
            cached(1, "a", 32, 30, 0),
            cached(2, "a", 62, 1, 1), new(2, "b", 4),
            cached(3, "a", 63, 1, 2), cached(3, "b", 4, 1, 1, pos=1),
            cached(4, "a", 64, 1, 3), cached(4, "b", 5, 1, 2, pos=1)]
    write(tmp_path, [r for r in rows if r["step"] <= last_step], settings=settings,
          requests=[intro(0, "a", 62), intro(2, "b", 4)])


def test_beyond_model_len_one_position_past(tmp_path):
    """Step 4 computes a's position 64 (64 computed + 1) in an engine of max_model_len 64; b,
    in the same step, stays within it and is not reported."""
    _long_prompt(tmp_path, last_step=4)
    assert tt.found(tmp_path, "tokens.beyond_model_len") == [
        (3, "a", "num_computed_tokens 63 + scheduled 1 = max_model_len 64, no position left for the token it samples"),
        (4, "a", "num_computed_tokens 64 + scheduled 1 > max_model_len 64")]


def test_beyond_model_len_against_the_engines_own_limit(tmp_path):
    """The limit is the engine's setting: with max_model_len 63, step 2 (62 + 1) leaves no
    position for its sampled token and step 3 (63 + 1) is past it."""
    _long_prompt(tmp_path, last_step=3, settings={"max_model_len": 63})
    assert tt.found(tmp_path, "tokens.beyond_model_len") == [
        (2, "a", "num_computed_tokens 62 + scheduled 1 = max_model_len 63, no position left for the token it samples"),
        (3, "a", "num_computed_tokens 63 + scheduled 1 > max_model_len 63")]


def test_beyond_model_len_last_position_exactly(tmp_path):
    """The trace ends at step 3, whose 63 + 1 = 64 reaches max_model_len exactly: the token
    that row samples has no position left (the runner asserts it stays below max_model_len);
    step 2 (62 + 1), one below, is clean."""
    _long_prompt(tmp_path, last_step=3)
    assert tt.found(tmp_path, "tokens.beyond_model_len") == [(3, "a", "num_computed_tokens 63 + scheduled 1 = max_model_len 64, no position left for the token it samples")]


# --- tokens.beyond_request ---------------------------------------------------------------------
# A request has prompt + outputs (+ drafts) tokens; computed + scheduled may reach that, not
# pass it. The three traces take the check's three ways to a row: a plain decode (read by the
# plain ids' shortcut), drafts, and a resume (both through the window).

def _decode(tmp_path, step2_tokens, **step2):
    write(tmp_path, [new(0, "a", 8), cached(1, "a", 8, 1, 1),
                     cached(2, "a", 9, step2_tokens, 2, **step2)],
          requests=[intro(0, "a", 8)])


def test_beyond_request_decode_past_its_tokens(tmp_path):
    """Step 2 schedules a 2 tokens when it has 8 + 2 = 10 and 9 are computed: 9 + 2 > 10."""
    _decode(tmp_path, 2)
    assert tt.found(tmp_path, "tokens.beyond_request") == [
        (2, "a", "cached: num_computed_tokens 9 + scheduled 2 > 10 tokens "
                 "(prompt + outputs + drafts)")]


def test_beyond_request_decode_one_token(tmp_path):
    """Near miss: step 2's one token, 9 + 1 = 10, the request's last known token."""
    _decode(tmp_path, 1)
    assert tt.found(tmp_path, "tokens.beyond_request") == []


def test_beyond_request_more_than_its_drafts(tmp_path):
    """Speculative decoding: step 2 schedules 3 tokens (its sampled one and 2 drafts) but
    carries only 1 draft: 9 + 3 > 8 + 2 + 1 = 11."""
    _decode(tmp_path, 3, spec_token_ids=[201])
    assert tt.found(tmp_path, "tokens.beyond_request") == [
        (2, "a", "cached: num_computed_tokens 9 + scheduled 3 > 11 tokens "
                 "(prompt + outputs + drafts)")]


def test_beyond_request_drafts_cover_the_tokens(tmp_path):
    """Near miss: the same 3 tokens with both drafts, 9 + 3 = 8 + 2 + 2."""
    _decode(tmp_path, 3, spec_token_ids=[201, 202])
    assert tt.found(tmp_path, "tokens.beyond_request") == []


def _preempted_then_resumed(tmp_path, computed, sched):
    # a (prompt 8) is preempted in step 2 for b (prompt 12) and resumed in step 3 with its
    # 8 + 2 tokens, `computed` of them found in the prefix cache
    write(tmp_path, [new(0, "a", 8), cached(1, "a", 8, 1, 1), new(2, "b", 12),
                     resumed(3, "a", computed, sched, 2), cached(3, "b", 12, 1, 1, pos=1)],
          requests=[intro(0, "a", 8), intro(2, "b", 12)],
          preempted=[{"step": 2, "req_id": "a"}])


def test_beyond_request_resume_past_its_tokens(tmp_path):
    """A resumed request recomputes its prompt and outputs, 10 tokens: 4 cached + 7 is one
    too many."""
    _preempted_then_resumed(tmp_path, computed=4, sched=7)
    assert tt.found(tmp_path, "tokens.beyond_request") == [
        (3, "a", "resumed: num_computed_tokens 4 + scheduled 7 > 10 tokens "
                 "(prompt + outputs + drafts)")]


def test_beyond_request_resume_recomputes_exactly(tmp_path):
    """Near miss: the resume's 4 cached + 6 = 10, all of its tokens."""
    _preempted_then_resumed(tmp_path, computed=4, sched=6)
    assert tt.found(tmp_path, "tokens.beyond_request") == []


def test_beyond_request_not_judged_without_an_introduction(tmp_path):
    """Near miss: x was introduced before the recording attached, so its prompt length is
    unknown: its rows (20 + 1 with 5 outputs, ...) are not judged as if its prompt were
    empty."""
    write(tmp_path, [cached(0, "x", 20, 1, 5), cached(1, "x", 21, 1, 6)],
          manifest={"attached_mid_stream": True})
    assert tt.found(tmp_path, "tokens.beyond_request") == []
