"""Diff tests of the checks on what the worker reads about drafts, structured output and
pipeline parallelism (docs/worker-reads.md, items 8-10): drafts the engine cannot verify,
has_structured_output_requests, and the cached requests' new_token_ids, pinned to exact rows of
tiny hand-built traces (tinytrace)."""

from __future__ import annotations

import json

import tinytrace as tt

NGRAM_2 = {"speculative": {"method": "ngram", "num_speculative_tokens": 2}}


def write(tmp_path, scheduled: list[dict], requests: list[dict] = (), settings=None,
          **step_columns) -> None:
    """Steps 0..the last listed step (`step_columns`: a column's value, or a callable of the
    step), with num_cached and the total agreeing with the rows."""
    n = max(r["step"] for r in scheduled) + 1

    def listed(i: int) -> list[dict]:
        return [r for r in scheduled if r["step"] == i and r.get("kind")]

    steps = tt.steps(
        n, total_num_scheduled_tokens=lambda i: sum(r["num_scheduled_tokens"] for r in listed(i)),
        num_new=lambda i: sum(r["kind"] == "new" for r in listed(i)),
        num_cached=lambda i: sum(r["kind"] != "new" for r in listed(i)), **step_columns)
    tt.write(tmp_path, {"steps": steps, "requests": list(requests), "scheduled": scheduled},
             settings=settings)


# --- spec.without_drafter ----------------------------------------------------------------------

def one_decode_with(spec: list[int] | None) -> list[dict]:
    """a prefills 4 tokens, then decodes at step 1 with `spec` as its drafts (1 + drafts)."""
    return [tt.new(0, "a", 0, 4, [0]),
            tt.cached(1, "a", 4, 1 + len(spec or []), [1], num_output_tokens=1,
                      spec_token_ids=spec)]


def test_drafts_without_a_drafter(tmp_path):
    """An engine without a speculative config: the worker writes a's draft as an input and
    samples after it, with nothing to reject it."""
    write(tmp_path, one_decode_with([7]), [tt.intro(0, "a", 4)])
    assert tt.found(tmp_path, "spec.without_drafter") == [
        (1, "a", "1 draft token(s), the engine has no speculative config")]


def test_drafts_with_a_drafter(tmp_path):
    """The same draft on an engine with an ngram drafter."""
    write(tmp_path, one_decode_with([7]), [tt.intro(0, "a", 4)], settings=NGRAM_2)
    assert tt.found(tmp_path, "spec.without_drafter") == []


def test_empty_drafts_without_a_drafter(tmp_path):
    """An empty draft list for a: the worker writes nothing."""
    write(tmp_path, one_decode_with([]), [tt.intro(0, "a", 4)])
    assert tt.found(tmp_path, "spec.without_drafter") == []


# --- spec.beyond_configured --------------------------------------------------------------------

def test_more_drafts_than_configured(tmp_path):
    """num_speculative_tokens 2, and a decodes with 3 drafts: its previous drafts are found at
    row * 2 in the worker's draft tensor."""
    write(tmp_path, one_decode_with([7, 8, 9]), [tt.intro(0, "a", 4)], settings=NGRAM_2)
    assert tt.found(tmp_path, "spec.beyond_configured") == [
        (1, "a", "3 drafts > num_speculative_tokens 2")]


def test_as_many_drafts_as_configured(tmp_path):
    write(tmp_path, one_decode_with([7, 8]), [tt.intro(0, "a", 4)], settings=NGRAM_2)
    assert tt.found(tmp_path, "spec.beyond_configured") == []


# --- spec.to_schedule_out_of_range -------------------------------------------------------------

def four_steps() -> list[dict]:
    return [tt.new(0, "a", 0, 4, [0])] + [
        tt.cached(i, "a", 3 + i, 1, [i] if i % 4 == 0 else None, num_output_tokens=i)
        for i in range(1, 4)]


def test_to_schedule_out_of_range(tmp_path):
    """num_speculative_tokens 2; steps 0..3 ask the drafter for 2, 3, -1 and 0 tokens: 3 is
    beyond its buffers and -1 is no count at all. 0 is what a dynamic schedule may send."""
    k = [2, 3, -1, 0]
    write(tmp_path, four_steps(), [tt.intro(0, "a", 4)], settings=NGRAM_2,
          num_spec_tokens_to_schedule=lambda i: k[i])
    assert tt.found(tmp_path, "spec.to_schedule_out_of_range") == [
        (1, None, "num_spec_tokens_to_schedule 3 outside 0..2"),
        (2, None, "num_spec_tokens_to_schedule -1 outside 0..2")]


def test_to_schedule_without_a_drafter(tmp_path):
    """The same counts on an engine without a drafter: its worker never proposes."""
    k = [2, 3, -1, 0]
    write(tmp_path, four_steps(), [tt.intro(0, "a", 4)],
          num_spec_tokens_to_schedule=lambda i: k[i])
    assert tt.found(tmp_path, "spec.to_schedule_out_of_range") == []


# --- structured.unflagged ----------------------------------------------------------------------

ASYNC_NGRAM = {"async_scheduling": True, **NGRAM_2}
GRAMMAR = {"__type__": "StructuredOutputsParams", "_backend": "xgrammar", "regex": "(yes|no)"}


def so_intro(step: int, rid: str, prompt_len: int, structured: bool, pos: int = 0) -> dict:
    """A request row whose sampling_params are JSON as the recorder writes them."""
    return {**tt.intro(step, rid, prompt_len, pos),
            "sampling_params": json.dumps({"__type__": "SamplingParams", "max_tokens": 4,
                                           "structured_outputs": GRAMMAR if structured
                                           else None})}


def grammar_run(tmp_path, settings: dict, flags: list[bool]) -> None:
    """g (structured, 8-token prompt) prefills 4 + 4: step 0 samples nothing, step 1 samples
    its first token, step 2 decodes with 2 placeholder drafts. p (plain) runs alone at step 3.
    `flags`: has_structured_output_requests of steps 0..3."""
    write(tmp_path,
          [tt.new(0, "g", 0, 4, [0]),
           tt.cached(1, "g", 4, 4, [1], num_output_tokens=0),
           tt.cached(2, "g", 8, 3, [2], num_output_tokens=1, spec_token_ids=[-1, -1]),
           tt.new(3, "p", 0, 4, [3])],
          [so_intro(0, "g", 8, True), so_intro(3, "p", 4, False)],
          settings=settings, has_structured_output_requests=lambda i: flags[i])


def test_structured_request_samples_unflagged(tmp_path):
    """Step 1 finishes g's prefill (it samples) with the flag false: an async worker with a
    drafter then keeps its drafts on the GPU. Step 0 is a prefill chunk, step 3 has only p."""
    grammar_run(tmp_path, ASYNC_NGRAM, [False, False, True, False])
    assert tt.found(tmp_path, "structured.unflagged") == [
        (1, None, "flag false, 1 structured-output request(s) sample: g")]


def test_structured_request_flagged(tmp_path):
    grammar_run(tmp_path, ASYNC_NGRAM, [False, True, True, False])
    assert tt.found(tmp_path, "structured.unflagged") == []


def test_structured_unflagged_where_the_worker_never_reads_it(tmp_path):
    """The same false flags on a sync engine with a drafter, and on an async one without."""
    grammar_run(tmp_path, NGRAM_2, [False, False, False, False])
    assert tt.found(tmp_path, "structured.unflagged") == []
    grammar_run(tmp_path, {"async_scheduling": True}, [False, False, False, False])
    assert tt.found(tmp_path, "structured.unflagged") == []


# --- tokens.new_token_ids_length ---------------------------------------------------------------

PP_2 = {"parallel": {"pipeline_parallel_size": 2}}


def pp_run(tmp_path, settings: dict, lists: dict[int, int], b_tokens: list[int]) -> None:
    """a and b prefill at step 0 and decode at steps 1..3, a with 2 drafts at step 3. Each
    cached row's new_token_ids is its one new token, except b's at step 2 (`b_tokens`);
    `lists`: cached_new_token_ids_len of the steps whose list is not one per request (the
    recorder's rows are NULL past it)."""
    rows = [tt.new(0, "a", 0, 4, [0]), tt.new(0, "b", 0, 4, [1], pos=1)]
    for i in range(1, 4):
        for pos, rid in enumerate("ab"):
            spec = [7, 8] if (i, rid) == (3, "a") else None
            toks = b_tokens if (i, rid) == (2, "b") else [10 + i]
            rows.append(tt.cached(i, rid, 3 + i, 1 + len(spec or []), pos=pos,
                                  num_output_tokens=i, spec_token_ids=spec,
                                  new_token_ids=toks if pos < lists.get(i, 2) else None))
    write(tmp_path, rows, [tt.intro(0, "a", 4), tt.intro(0, "b", 4, pos=1)], settings=settings,
          cached_new_token_ids_len=lambda i: 0 if i == 0 else lists.get(i, 2))


def test_new_token_ids_of_the_wrong_length(tmp_path):
    """Pipeline parallel without async: step 1 sends one list for two cached requests (the
    worker's new_token_ids[1] is an IndexError), step 2 an empty list for b, which schedules
    one token (its sampled token never reaches the first stage). a's list at step 3 leaves its
    2 drafts out, as the scheduler does."""
    pp_run(tmp_path, PP_2, {1: 1}, [])
    assert tt.found(tmp_path, "tokens.new_token_ids_length") == [
        (1, None, "1 new_token_ids lists for 2 cached requests"),
        (2, "b", "0 new tokens for 1 scheduled without drafts")]


def test_no_new_token_ids_on_a_sync_pipeline(tmp_path):
    """No lists at all at step 2 of a sync pipeline: the stages before the last never get
    the tokens. Under async scheduling that is the rule (they go by GPU broadcast)."""
    pp_run(tmp_path, PP_2, {2: 0}, [12])
    assert tt.found(tmp_path, "tokens.new_token_ids_length") == [
        (2, None, "0 new_token_ids lists for 2 cached requests")]
    pp_run(tmp_path, {**PP_2, "async_scheduling": True}, {2: 0}, [12])
    assert tt.found(tmp_path, "tokens.new_token_ids_length") == []


def test_new_token_ids_right_or_unread(tmp_path):
    """One list per request, each as long as its tokens without drafts; and the broken lists
    of the first test on a single-stage engine, whose worker never reads them."""
    pp_run(tmp_path, PP_2, {}, [12])
    assert tt.found(tmp_path, "tokens.new_token_ids_length") == []
    pp_run(tmp_path, {}, {1: 1}, [])
    assert tt.found(tmp_path, "tokens.new_token_ids_length") == []
