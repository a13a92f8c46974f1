"""Diff tests of the checks on the recording itself (trace.*): tiny traces whose manifest or
step sequence says what the recorder could not capture, with the exact rows each check must
return.

Each trace records one request, a, with a prompt of 8 that is prefilled in step `prefill` and
then decodes one token a step, in the steps that were recorded only (a dropped or missing step
ran all the same)."""

from __future__ import annotations

import tinytrace as tt


def write(tmp_path, recorded, prefill=0, **manifest):
    """The trace of the `recorded` steps; `manifest` overrides tinytrace's clean close."""
    steps, scheduled, requests = [], [], []
    for s in recorded:
        if s == prefill:
            requests.append({"step": s, "req_id": "a", "pos": 0, "prompt_len": 8})
            scheduled.append({"step": s, "req_id": "a", "kind": "new", "pos": 0,
                              "num_computed_tokens": 0, "num_scheduled_tokens": 8})
        else:
            scheduled.append({"step": s, "req_id": "a", "kind": "cached", "pos": 0,
                              "num_computed_tokens": 8 + s - prefill - 1,
                              "num_scheduled_tokens": 1, "num_output_tokens": s - prefill})
        steps.append({"step": s, "total_num_scheduled_tokens": 8 if s == prefill else 1,
                      "num_new": int(s == prefill), "num_cached": int(s != prefill)})
    return tt.write(tmp_path, {"steps": steps, "scheduled": scheduled, "requests": requests},
                    **manifest)


def error(msg):
    """A recorder_errors entry as the writer notes it."""
    return {"time": 1700000000.0, "error": msg}


# --- trace.attached_mid_stream -----------------------------------------------------------------

def test_attached_mid_stream_reported_once(tmp_path):
    """The recorder attached to an engine already running a (prefilled 3 steps before the first
    recorded one): one note for the engine, with no step and no request."""
    write(tmp_path, range(4), prefill=-3, attached_mid_stream=True)
    assert tt.found(tmp_path, "trace.attached_mid_stream") == [
        (None, None, "recording attached to a running engine")]


def test_attached_mid_stream_recorded_from_the_start(tmp_path):
    """Near miss: the recording began with the engine; a is introduced in step 0."""
    write(tmp_path, range(4), attached_mid_stream=False)
    assert tt.found(tmp_path, "trace.attached_mid_stream") == []


# --- trace.unclean_close -----------------------------------------------------------------------

def test_unclean_close(tmp_path):
    """The recording process died before sealing the trace (closed_cleanly false)."""
    write(tmp_path, range(4), closed_cleanly=False)
    assert tt.found(tmp_path, "trace.unclean_close") == [(None, None, "not closed cleanly")]


def test_unclean_close_counts_recorder_errors(tmp_path):
    """The writer failed and noted two errors: the note says how many."""
    write(tmp_path, range(4), closed_cleanly=False,
          recorder_errors=[error("OSError: [Errno 28] No space left on device"),
                           error("RuntimeError: writer failed")])
    assert tt.found(tmp_path, "trace.unclean_close") == [
        (None, None, "not closed cleanly (2 recorder error(s), see info)")]


def test_unclean_close_clean_close_despite_an_error(tmp_path):
    """Near miss: a trace sealed cleanly though the recorder noted an error on the way."""
    write(tmp_path, range(4), closed_cleanly=True,
          recorder_errors=[error("OSError: [Errno 28] No space left on device")])
    assert tt.found(tmp_path, "trace.unclean_close") == []


# --- trace.dropped_steps -----------------------------------------------------------------------

def test_dropped_steps_one_gap(tmp_path):
    """The writer fell behind and dropped steps 3..5, declared in the manifest: one warning at
    the gap's first step."""
    write(tmp_path, [0, 1, 2, 6, 7], dropped_steps=[[3, 5]], dropped_steps_total=3)
    assert tt.found(tmp_path, "trace.dropped_steps") == [
        (3, None, "steps 3..5 were not recorded")]


def test_dropped_steps_two_gaps(tmp_path):
    """Two declared gaps, one of a single step: one warning each, in step order."""
    write(tmp_path, [0, 1, 3, 4, 7], dropped_steps=[[2, 2], [5, 6]], dropped_steps_total=3)
    assert tt.found(tmp_path, "trace.dropped_steps") == [
        (2, None, "steps 2..2 were not recorded"), (5, None, "steps 5..6 were not recorded")]


def test_dropped_steps_undeclared_hole_is_not_a_drop(tmp_path):
    """Near miss: the same hole 3..5 with nothing declared: not a drop (trace.missing_steps
    reports it)."""
    write(tmp_path, [0, 1, 2, 6, 7])
    assert tt.found(tmp_path, "trace.dropped_steps") == []


# --- trace.missing_steps -----------------------------------------------------------------------

def test_missing_steps_one_hole(tmp_path):
    """Steps 3 and 4 are not in the steps table and the manifest declares no drop: a damaged
    or edited trace."""
    write(tmp_path, [0, 1, 2, 5, 6])
    assert tt.found(tmp_path, "trace.missing_steps") == [(3, None, "steps 3..4 missing")]


def test_missing_steps_two_holes(tmp_path):
    """Two undeclared holes, one of a single step: one warning each, at its first step."""
    write(tmp_path, [0, 2, 3, 6])
    assert tt.found(tmp_path, "trace.missing_steps") == [
        (1, None, "steps 1..1 missing"), (4, None, "steps 4..5 missing")]


def test_missing_steps_hole_declared_dropped(tmp_path):
    """Near miss: the same hole 3..4, declared by the recorder as dropped."""
    write(tmp_path, [0, 1, 2, 5, 6], dropped_steps=[[3, 4]], dropped_steps_total=2)
    assert tt.found(tmp_path, "trace.missing_steps") == []


def test_missing_steps_hole_declared_in_part(tmp_path):
    """The recorder declared step 3 dropped, but step 4 is missing as well (the writer closes a
    gap at the next recorded step, so a declared gap covers its whole hole): step 4 is an
    undeclared hole."""
    write(tmp_path, [0, 1, 2, 5, 6], dropped_steps=[[3, 3]], dropped_steps_total=1)
    assert tt.found(tmp_path, "trace.missing_steps") == [(4, None, "steps 4..4 missing")]


def test_missing_steps_leading_hole(tmp_path):
    """The trace's first steps 0..2 are gone (its first segment deleted) and nothing declares
    them: the recorder numbers from 0, and declares a dropped or pruned head in dropped_steps."""
    write(tmp_path, [3, 4, 5, 6])
    assert tt.found(tmp_path, "trace.missing_steps") == [(0, None, "steps 0..2 missing")]
