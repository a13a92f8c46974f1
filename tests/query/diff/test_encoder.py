"""Diff tests of the encoder-cache checks (encoder.*): which encoder inputs a step schedules,
and which encoder outputs (by identifier, the encoder-cache key) it tells the worker to free.

Every request here has one image, placeholder tokens 0..3 of an 8-token prompt, and schedules
it with its prefill (scheduled_encoder_inputs [0])."""

from __future__ import annotations

import tinytrace as tt


def intro(step, rid, pos=0):
    return {"step": step, "req_id": rid, "pos": pos, "prompt_len": 8}


def image(step, rid, identifier):
    # the processor's hash differs from the encoder-cache key, which is what gets freed
    return {"step": step, "req_id": rid, "pos": 0, "identifier": identifier,
            "mm_hash": "proc-" + identifier, "modality": "image", "offset": 0, "length": 4}


def prefill(step, rid, blocks, pos=0):
    return {"step": step, "req_id": rid, "kind": "new", "pos": pos, "num_computed_tokens": 0,
            "num_scheduled_tokens": 8, "new_block_ids": [blocks], "encoder_inputs": [0]}


def decode(step, rid, computed, blocks=None, pos=0):
    return {"step": step, "req_id": rid, "kind": "cached", "pos": pos,
            "num_computed_tokens": computed, "num_scheduled_tokens": 1,
            "new_block_ids": None if blocks is None else [blocks]}


def finish(step, rid):
    """The finish event in step's update and the id's delivery with the next step."""
    return {"finish_events": [{"step": step, "req_id": rid, "reason": "LENGTH",
                               "source": "update_from_output", "t_ns": step * 1000 + 500}],
            "finished": [{"step": step + 1, "req_id": rid}]}


def freed(step, *identifiers):
    return [{"step": step, "pos": i, "mm_hash": h} for i, h in enumerate(identifiers)]


def write(tmp_path, n_steps, scheduled, **tables):
    def total(i):
        return sum(r.get("num_scheduled_tokens") or 0 for r in scheduled if r["step"] == i)
    return tt.write(tmp_path, {"steps": tt.steps(n_steps, total_num_scheduled_tokens=total),
                               "scheduled": scheduled, **tables})


def _one_image(tmp_path, freed_mm, intro_step=0):
    # a brings image img-a at intro_step, decodes one token and finishes in the next step's
    # update; the trace runs two steps past that
    s = intro_step
    write(tmp_path, s + 4, [prefill(s, "a", [0, 1]), decode(s + 1, "a", 8, [2])],
          requests=[intro(s, "a")], mm_inputs=[image(s, "a", "img-a")], freed_mm=freed_mm,
          **finish(s + 1, "a"))


# --- encoder.free_unknown -----------------------------------------------------------------------

def test_free_unknown_hash_no_request_brought(tmp_path):
    """The scheduler frees an encoder output whose key no request ever brought: its
    bookkeeping and the worker's have diverged."""
    _one_image(tmp_path, freed(2, "img-a", "img-z"))
    assert tt.found(tmp_path, "encoder.free_unknown") == [
        (2, None, "freed img-z, never an input of a request before")]


def test_free_unknown_processor_hash_is_not_the_key(tmp_path):
    """The worker's encoder cache is keyed by identifier: freeing the processor's mm_hash
    instead names nothing the worker holds."""
    _one_image(tmp_path, freed(2, "proc-img-a"))
    assert tt.found(tmp_path, "encoder.free_unknown") == [
        (2, None, "freed proc-img-a, never an input of a request before")]


def test_free_unknown_freed_before_its_request_came(tmp_path):
    """A key freed in step 0 that a request brings only in step 1 was unknown when freed."""
    _one_image(tmp_path, freed(0, "img-a"), intro_step=1)
    assert tt.found(tmp_path, "encoder.free_unknown") == [
        (0, None, "freed img-a, never an input of a request before")]


def test_free_unknown_freed_after_its_request(tmp_path):
    """Near miss: the image's own key, freed after the request that brought it finished."""
    _one_image(tmp_path, freed(2, "img-a"))
    assert tt.found(tmp_path, "encoder.free_unknown") == []


def test_free_unknown_freed_a_second_time(tmp_path):
    """img-a is freed with a's finish (step 2) and again in step 3, with nothing bringing it
    back in between: the second pop names nothing the worker holds."""
    _one_image(tmp_path, freed(2, "img-a") + freed(3, "img-a"))
    assert tt.found(tmp_path, "encoder.free_unknown") == [
        (3, None, "freed img-a again, neither brought nor computed since its free at step 2")]


def test_free_unknown_freed_twice_in_one_step(tmp_path):
    """The same key twice in one step's free_encoder_mm_hashes: the second is a miss."""
    _one_image(tmp_path, freed(2, "img-a", "img-a"))
    assert tt.found(tmp_path, "encoder.free_unknown") == [
        (2, None, "freed img-a again, neither brought nor computed since its free at step 2")]


def _freed_then_back(tmp_path, back, second_free=4):
    # img-a is freed with a's finish (step 2) and again at second_free; `back` adds b's rows,
    # which may bring img-a back in between
    write(tmp_path, 6, [prefill(0, "a", [0, 1]), decode(1, "a", 8, [2])] + back["scheduled"],
          requests=[intro(0, "a")] + back.get("requests", []),
          mm_inputs=[image(0, "a", "img-a")] + back.get("mm_inputs", []),
          freed_mm=freed(2, "img-a") + freed(second_free, "img-a"),
          preempted=back.get("preempted", []), **finish(1, "a"))


def test_free_unknown_freed_again_after_a_new_request_brought_it(tmp_path):
    """Near miss: b brings img-a at step 3, between the two frees."""
    _freed_then_back(tmp_path, {"scheduled": [prefill(3, "b", [3, 4])],
                                "requests": [intro(3, "b")],
                                "mm_inputs": [image(3, "b", "img-a")]})
    assert tt.found(tmp_path, "encoder.free_unknown") == []


def _b_recomputes(step):
    # b brought img-a at step 0 as its second input (pos 1) and is preempted; back at `step`,
    # it recomputes that input without being introduced again
    b_image = dict(image(0, "b", "img-a"), pos=1, offset=4)
    first = dict(prefill(0, "b", [3, 4]), num_scheduled_tokens=4)
    back = dict(tt.resumed(step, "b", 0, 8, [5, 6]), encoder_inputs=[1])
    return {"scheduled": [first, back], "requests": [intro(0, "b")],
            "mm_inputs": [image(0, "b", "img-b"), b_image],
            "preempted": [{"step": 1, "req_id": "b"}]}


def test_free_unknown_freed_again_after_a_resumed_request_recomputed_it(tmp_path):
    """Near miss: resumed b recomputes img-a (its input 1) in the step of the first free,
    after the worker freed it, so the output is cached again when step 4 frees it."""
    _freed_then_back(tmp_path, _b_recomputes(2))
    assert tt.found(tmp_path, "encoder.free_unknown") == []


def test_free_unknown_freed_again_in_the_step_that_recomputes_it(tmp_path):
    """b recomputes img-a in step 4 itself: the worker frees before it computes, so step 4's
    free still names nothing it holds. (b's introduction at step 0, before the first free,
    does not bring it back.)"""
    _freed_then_back(tmp_path, _b_recomputes(4))
    assert tt.found(tmp_path, "encoder.free_unknown") == [
        (4, None, "freed img-a again, neither brought nor computed since its free at step 2")]


# --- encoder.freed_while_needed -----------------------------------------------------------------

def _same_image_again(tmp_path, b_step):
    # a's image is freed with a's finish in step 2; b brings the same image at b_step and
    # schedules its encoder input there
    write(tmp_path, b_step + 1,
          [prefill(0, "a", [0, 1]), decode(1, "a", 8, [2]), prefill(b_step, "b", [3, 4])],
          requests=[intro(0, "a"), intro(b_step, "b")],
          mm_inputs=[image(0, "a", "img"), image(b_step, "b", "img")],
          freed_mm=freed(2, "img"), **finish(1, "a"))


def test_freed_while_needed_same_step(tmp_path):
    """Step 2 frees the image while scheduling a request that reads it: the worker frees
    before it runs the step, so the encoder output is gone when b needs it."""
    _same_image_again(tmp_path, b_step=2)
    assert tt.found(tmp_path, "encoder.freed_while_needed") == [
        (2, "b", "needs img, freed at step 2")]


def test_freed_while_needed_next_step(tmp_path):
    """The image freed in step 2 is scheduled for b in step 3, the very next step."""
    _same_image_again(tmp_path, b_step=3)
    assert tt.found(tmp_path, "encoder.freed_while_needed") == [
        (3, "b", "needs img, freed at step 2")]


def test_freed_while_needed_two_steps_later(tmp_path):
    """Near miss: b brings the freed image two steps after the free."""
    _same_image_again(tmp_path, b_step=4)
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []


def _image_across_chunks(tmp_path, freed_mm, offset=2, length=8):
    # a's 12-token prompt is prefilled in two chunks of 6 (steps 0 and 1), then decodes at step
    # 2; its image (by default placeholder tokens 2..9, across the chunks' boundary) is encoded
    # with the first chunk. The worker reads it again wherever a chunk's
    # window overlaps the placeholder.
    chunk = {"step": 1, "req_id": "a", "kind": "cached", "pos": 0, "num_computed_tokens": 6,
             "num_scheduled_tokens": 6, "new_block_ids": [[2]]}
    first = dict(prefill(0, "a", [0, 1]), num_scheduled_tokens=6)
    write(tmp_path, 3, [first, chunk, decode(2, "a", 12, [3])],
          requests=[dict(intro(0, "a"), prompt_len=12)],
          mm_inputs=[dict(image(0, "a", "img-a"), offset=offset, length=length)], freed_mm=freed_mm)


def test_freed_while_needed_between_chunks(tmp_path):
    """The image is encoded with the first chunk (step 0) and freed at step 1, whose chunk
    (tokens 6..11) still covers placeholder tokens 6..9: the worker reads the freed output.
    Step 1 does not schedule the input, so only its window says that it reads it."""
    _image_across_chunks(tmp_path, freed(1, "img-a"))
    assert tt.found(tmp_path, "encoder.freed_while_needed") == [
        (1, "a", "reads (a chunk over its placeholder) img-a, freed at step 1")]


def test_freed_while_needed_after_the_last_chunk(tmp_path):
    """Near miss: freed at step 2, whose decode window (token 12) is past the placeholder."""
    _image_across_chunks(tmp_path, freed(2, "img-a"))
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []


def test_freed_while_needed_placeholder_in_the_first_chunk(tmp_path):
    """Near miss: the same free at step 1, but the image's placeholder (tokens 0..5) ends with
    the first chunk: step 1's window (tokens 6..11) does not read it."""
    _image_across_chunks(tmp_path, freed(1, "img-a"), offset=0, length=6)
    assert tt.found(tmp_path, "encoder.freed_while_needed") == []


# --- encoder.never_freed ------------------------------------------------------------------------

def test_never_freed_after_its_only_request(tmp_path):
    """The only request with img-a finished (delivered in step 2) and the key is never freed:
    the encoder cache keeps it for good."""
    _one_image(tmp_path, [])
    assert tt.found(tmp_path, "encoder.never_freed") == [
        (2, "a", "img-a never freed after its last request ended at step 2")]


def test_never_freed_freed_later(tmp_path):
    """Near miss: the key is evicted (freed) a step after its request ended."""
    _one_image(tmp_path, freed(3, "img-a"))
    assert tt.found(tmp_path, "encoder.never_freed") == []


def test_never_freed_while_another_request_uses_it(tmp_path):
    """Near miss: a second request brought the same image and still runs at the trace's end,
    so the key is rightly kept."""
    write(tmp_path, 4,
          [prefill(0, "a", [0, 1]), decode(1, "a", 8, [2]), prefill(1, "b", [3, 4]),
           decode(2, "b", 8, [5]), decode(3, "b", 9)],
          requests=[intro(0, "a"), intro(1, "b")],
          mm_inputs=[image(0, "a", "img"), image(1, "b", "img")], **finish(1, "a"))
    assert tt.found(tmp_path, "encoder.never_freed") == []


def test_never_freed_after_a_second_life(tmp_path):
    """z's image is freed in step 2 after z ended; b brings it back in step 3 (the encoder
    recomputes it) and ends, delivered in step 5; after that it is never freed again."""
    write(tmp_path, 6,
          [prefill(0, "z", [0, 1]), decode(1, "z", 8, [2]),
           prefill(3, "b", [3, 4]), decode(4, "b", 8, [5])],
          requests=[intro(0, "z"), intro(3, "b")],
          mm_inputs=[image(0, "z", "img"), image(3, "b", "img")], freed_mm=freed(2, "img"),
          finish_events=finish(1, "z")["finish_events"] + finish(4, "b")["finish_events"],
          finished=finish(1, "z")["finished"] + finish(4, "b")["finished"])
    assert tt.found(tmp_path, "encoder.never_freed") == [
        (5, "b", "img never freed after its last request ended at step 5")]


# --- encoder.unscheduled ------------------------------------------------------------------------

def _a_decoding_at_step_1(tmp_path, **b):
    # a brought img-a in step 0 and decodes in step 1; b's rows are added to a's
    write(tmp_path, 2, [prefill(0, "a", [0, 1]), decode(1, "a", 8, [2])] + b["scheduled"],
          requests=[intro(0, "a")] + b.get("requests", []),
          mm_inputs=[image(0, "a", "img-a")] + b.get("mm_inputs", []))


def test_unscheduled_encoder_inputs_of_a_waiting_request(tmp_path):
    """Step 1 lists encoder inputs for b, which gets no tokens (it is only a key of
    scheduled_encoder_inputs): the batch has no place for its encoder outputs."""
    _a_decoding_at_step_1(tmp_path,
                          scheduled=[{"step": 1, "req_id": "b", "encoder_inputs": [0]}])
    assert tt.found(tmp_path, "encoder.unscheduled") == [
        (1, "b", "scheduled_encoder_inputs without scheduled tokens")]


def test_unscheduled_encoder_inputs_with_the_prefill(tmp_path):
    """Near miss: b is admitted in step 1 and its image is encoded with its prefill."""
    _a_decoding_at_step_1(tmp_path, scheduled=[prefill(1, "b", [3, 4])],
                          requests=[intro(1, "b")], mm_inputs=[image(1, "b", "img-b")])
    assert tt.found(tmp_path, "encoder.unscheduled") == []


# --- encoder.input_unknown ----------------------------------------------------------------------

def test_input_unknown_index_past_the_features(tmp_path):
    """a brought one image and its prefill schedules encoder inputs 0 and 1: mm_features[1] is
    an IndexError in the worker."""
    write(tmp_path, 1, [dict(prefill(0, "a", [0, 1]), encoder_inputs=[0, 1])],
          requests=[intro(0, "a")], mm_inputs=[image(0, "a", "img-a")])
    assert tt.found(tmp_path, "encoder.input_unknown") == [
        (0, "a", "encoder input 1 outside the 1 mm_features of its introduction at step 0")]


def _b_without_features(tmp_path, a_image):
    # a brings an image (or not), b none, and both prefills schedule encoder input 0
    write(tmp_path, 1, [prefill(0, "a", [0, 1]), prefill(0, "b", [2, 3], pos=1)],
          requests=[intro(0, "a"), intro(0, "b", pos=1)],
          mm_inputs=[image(0, "a", "img-a")] if a_image else [])


def test_input_unknown_request_without_features(tmp_path):
    """b brought no multimodal input at all, yet its prefill schedules encoder input 0."""
    _b_without_features(tmp_path, a_image=True)
    assert tt.found(tmp_path, "encoder.input_unknown") == [
        (0, "b", "encoder input 0 outside the 0 mm_features of its introduction at step 0")]


def test_input_unknown_text_only_engine(tmp_path):
    """Near miss: no request of the engine brought a multimodal input, so its model is taken
    for a text-only one, whose runner never reads scheduled_encoder_inputs."""
    _b_without_features(tmp_path, a_image=False)
    assert tt.found(tmp_path, "encoder.input_unknown") == []


def test_input_unknown_second_of_two_images(tmp_path):
    """Near miss: a brought two images, and its prefill schedules both."""
    write(tmp_path, 1, [dict(prefill(0, "a", [0, 1]), encoder_inputs=[0, 1])],
          requests=[intro(0, "a")],
          mm_inputs=[image(0, "a", "img-a"), dict(image(0, "a", "img-a2"), pos=1, offset=4)])
    assert tt.found(tmp_path, "encoder.input_unknown") == []


def _reused_id(tmp_path, second_inputs):
    # a's first instance brings two images (step 0) and finishes; the id comes back at step 3
    # with one image, its prefill scheduling `second_inputs`
    write(tmp_path, 4,
          [dict(prefill(0, "a", [0, 1]), encoder_inputs=[0, 1]), decode(1, "a", 8, [2]),
           dict(prefill(3, "a", [3, 4]), encoder_inputs=second_inputs)],
          requests=[intro(0, "a"), intro(3, "a")],
          mm_inputs=[image(0, "a", "img-a"), dict(image(0, "a", "img-a2"), pos=1, offset=4),
                     image(3, "a", "img-c")], **finish(1, "a"))


def test_input_unknown_reused_id_counts_its_own_features(tmp_path):
    """The reused id's new instance brought one image: its input 1 is out of range, although
    the id's first instance had two."""
    _reused_id(tmp_path, [1])
    assert tt.found(tmp_path, "encoder.input_unknown") == [
        (3, "a", "encoder input 1 outside the 1 mm_features of its introduction at step 3")]


def test_input_unknown_reused_id_in_range(tmp_path):
    """Near miss: the new instance schedules its one image."""
    _reused_id(tmp_path, [0])
    assert tt.found(tmp_path, "encoder.input_unknown") == []


def _prefix_hit(tmp_path, computed):
    # a is introduced with `computed` prompt tokens already cached (a prefix hit) and its
    # image (tokens 0..3) scheduled for encoding with the rest of the prefill
    write(tmp_path, 1,
          [dict(prefill(0, "a", [0, 1]), num_computed_tokens=computed,
                num_scheduled_tokens=8 - computed)],
          requests=[intro(0, "a")], mm_inputs=[image(0, "a", "img-a")])


def test_input_unknown_stripped_feature(tmp_path):
    """The prefix hit covers the image's placeholder: NewRequestData carries the feature without
    its data, and the worker skips the scheduled input, caching nothing."""
    _prefix_hit(tmp_path, 4)
    assert tt.found(tmp_path, "encoder.input_unknown") == [
        (0, "a", "encoder input 0 (img-a, tokens 0..3) came without its data: "
                 "num_computed_tokens 4 at its introduction (step 0) covered it")]


def test_input_unknown_feature_not_quite_covered(tmp_path):
    """Near miss: the hit stops one token short of the placeholder's end, so the data came."""
    _prefix_hit(tmp_path, 3)
    assert tt.found(tmp_path, "encoder.input_unknown") == []


def test_input_unknown_stripped_feature_after_a_preemption(tmp_path):
    """a came with its image covered (data stripped) and is preempted; resumed from token 0 it
    schedules the image's encoder, but the worker still holds the stripped feature from a's
    introduction."""
    first = dict(prefill(0, "a", [0, 1]), num_computed_tokens=4, num_scheduled_tokens=4,
                 encoder_inputs=None)
    back = dict(tt.resumed(2, "a", 0, 8, [2, 3]), encoder_inputs=[0])
    write(tmp_path, 3, [first, back], requests=[intro(0, "a")],
          mm_inputs=[image(0, "a", "img-a")], preempted=[{"step": 1, "req_id": "a"}])
    assert tt.found(tmp_path, "encoder.input_unknown") == [
        (2, "a", "encoder input 0 (img-a, tokens 0..3) came without its data: "
                 "num_computed_tokens 4 at its introduction (step 0) covered it")]
