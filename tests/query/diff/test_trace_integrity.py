"""Diff tests of the checks on the trace's own integrity (trace.checksum, trace.count_mismatch,
trace.duplicate_rows, trace.impossible_steps, trace.lost_rows, trace.unverified): tiny traces with one damage each, and the exact
rows each check must return."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

import tinytrace as tt
from vllm_contract import schema
from vllm_contract.trace import CHECKSUM_KEY, batch_checksum


def steps_as_stream(root, checksum=None) -> None:
    """Replace the steps table's Parquet file with a stream segment of the same rows, its one
    batch stamped with `checksum` (its true checksum if None)."""
    d = root / tt.ENGINE / "steps"
    data = pq.read_table(d / "000000.parquet").cast(schema.schema("steps"))
    (d / "000000.parquet").unlink()
    (batch,) = data.to_batches()
    with pa.OSFile(str(d / "000000.arrows"), "wb") as sink:
        with ipc.new_stream(sink, data.schema) as w:
            w.write_batch(batch, custom_metadata={
                CHECKSUM_KEY: batch_checksum(batch) if checksum is None else checksum})


# --- trace.checksum ----------------------------------------------------------------------------

def test_checksum_batch_damaged(tmp_path):
    """A steps batch whose stored checksum is not its data's: one finding for the segment."""
    tt.write(tmp_path, {"steps": tt.steps(3)})
    steps_as_stream(tmp_path, checksum=b"12345")
    assert tt.found(tmp_path, "trace.checksum") == [
        (None, None, "steps/000000.arrows: 1 of 1 batches fail their checksum (data damaged "
                     "after it was written)")]


def test_checksum_intact(tmp_path):
    """Near miss: the same stream with its true checksum."""
    tt.write(tmp_path, {"steps": tt.steps(3)})
    steps_as_stream(tmp_path)
    assert tt.found(tmp_path, "trace.checksum") == []


# --- trace.count_mismatch ----------------------------------------------------------------------

def test_count_mismatch_rows_lost(tmp_path):
    """The manifest counts 5 steps written; the steps table holds 3."""
    tt.write(tmp_path, {"steps": tt.steps(3)}, steps_recorded=5)
    assert tt.found(tmp_path, "trace.count_mismatch") == [
        (None, None, "the manifest counts 5 steps written, the steps table holds 3")]


def test_count_mismatch_rows_added_after_a_clean_close(tmp_path):
    """A clean close counted 2 steps; 3 are on disk."""
    tt.write(tmp_path, {"steps": tt.steps(3)}, steps_recorded=2)
    assert tt.found(tmp_path, "trace.count_mismatch") == [
        (None, None, "the manifest counts 2 steps written, the steps table holds 3")]


def test_count_mismatch_stale_manifest_of_a_crash(tmp_path):
    """Near miss: a trace not closed cleanly whose manifest predates its last writes."""
    tt.write(tmp_path, {"steps": tt.steps(3)}, steps_recorded=0, closed_cleanly=False)
    assert tt.found(tmp_path, "trace.count_mismatch") == []


def test_count_mismatch_pruned_steps_are_counted(tmp_path):
    """Near miss: steps 0..1 were deleted at the size cap; 3 of 5 counted remain."""
    tt.write(tmp_path, {"steps": tt.steps(5)[2:]}, steps_recorded=5,
             dropped_steps=[[0, 1]], dropped_steps_total=2,
             pruned_segments=[{"segment": 0, "bytes": 100, "steps": [0, 1],
                               "reason": "max_trace_bytes"}])
    assert tt.found(tmp_path, "trace.count_mismatch") == []


# --- trace.duplicate_rows ----------------------------------------------------------------------

def test_duplicate_rows_step_twice(tmp_path):
    """Step 1 is in the steps table twice."""
    tt.write(tmp_path, {"steps": tt.steps(3) + [{"step": 1}]})
    assert tt.found(tmp_path, "trace.duplicate_rows") == [
        (1, None, "steps: 1 row(s) repeat another with the same step, from step 1")]


def test_duplicate_rows_finish_event_twice(tmp_path):
    """The same finish event (same time) twice: a copied segment."""
    ev = {"step": 2, "req_id": "a", "reason": "STOP", "source": "update_from_output",
          "t_ns": 2500}
    tt.write(tmp_path, {"steps": tt.steps(3), "finish_events": [ev, dict(ev)]})
    assert tt.found(tmp_path, "trace.duplicate_rows") == [
        (2, None, "finish_events: 1 row(s) repeat another with the same step, req_id, reason, "
                  "source, t_ns, from step 2")]


def test_duplicate_rows_two_finishes_of_one_request(tmp_path):
    """Near miss: an abort and a stop of the same request in one step are two events."""
    ev = {"step": 2, "req_id": "a", "reason": "STOP", "source": "update_from_output",
          "t_ns": 2500}
    abort = {**ev, "reason": "FINISHED_ABORTED", "source": "finish_requests", "t_ns": 2600}
    tt.write(tmp_path, {"steps": tt.steps(3), "finish_events": [ev, abort]})
    assert tt.found(tmp_path, "trace.duplicate_rows") == []


# --- trace.impossible_steps --------------------------------------------------------------------

def test_impossible_steps_negative_and_huge(tmp_path):
    """Updates keyed by step -5 and 2^40: one finding per table, at its smallest step."""
    tt.write(tmp_path, {"steps": tt.steps(3),
                        "updates": [{"step": -5}, {"step": 1}, {"step": 1 << 40}]})
    assert tt.found(tmp_path, "trace.impossible_steps") == [
        (-5, None, "updates: 2 row(s) with impossible step numbers (-5..1099511627776)")]


def test_impossible_steps_abort_before_the_first_step(tmp_path):
    """Near miss: finish_events' step -1 is an abort before the first recorded step."""
    tt.write(tmp_path, {"steps": tt.steps(3), "finish_events": [
        {"step": -1, "req_id": "a", "reason": "FINISHED_ABORTED", "source": "finish_requests",
         "t_ns": 1}]})
    assert tt.found(tmp_path, "trace.impossible_steps") == []


# --- trace.lost_rows ---------------------------------------------------------------------------

def steps_as_committed_stream(root, counts: dict[str, int]) -> None:
    """The steps table as a stream written with commit markers: its one flush counts `counts`
    rows of the other tables (as the writer stamps each flush's steps batch, last)."""
    import json

    from vllm_contract.trace import COMMITS_KEY, ROWS_KEY

    d = root / tt.ENGINE / "steps"
    data = pq.read_table(d / "000000.parquet").cast(schema.schema("steps"))
    (d / "000000.parquet").unlink()
    (batch,) = data.to_batches()
    marked = data.schema.with_metadata({COMMITS_KEY: b"1"})
    with pa.OSFile(str(d / "000000.arrows"), "wb") as sink:
        with ipc.new_stream(sink, marked) as w:
            w.write_batch(batch, custom_metadata={
                CHECKSUM_KEY: batch_checksum(batch),
                ROWS_KEY: json.dumps({"steps": len(data), **counts}).encode()})


def finished_rows(n: int) -> list[dict]:
    return [{"step": 1, "req_id": f"r{i}"} for i in range(n)]


def test_lost_rows_fewer_than_committed(tmp_path):
    """The markers count 2 finished rows written to segment 0; it holds 1."""
    tt.write(tmp_path, {"steps": tt.steps(3), "finished": finished_rows(1)})
    steps_as_committed_stream(tmp_path, {"finished": 2})
    (row,) = tt.found(tmp_path, "trace.lost_rows")
    assert row[:2] == (None, None)
    assert "finished/000000.parquet: holds 1 of the 2 row(s)" in row[2], row


def test_lost_rows_segment_gone(tmp_path):
    """The markers count 2 finished rows; the finished segment is gone."""
    tt.write(tmp_path, {"steps": tt.steps(3), "finished": finished_rows(2)})
    steps_as_committed_stream(tmp_path, {"finished": 2})
    (tmp_path / tt.ENGINE / "finished" / "000000.parquet").unlink()
    (row,) = tt.found(tmp_path, "trace.lost_rows")
    assert "finished/000000.arrows: gone" in row[2] and "count 2 row(s)" in row[2], row


def test_lost_rows_all_held(tmp_path):
    """Near miss: the markers count 2 finished rows and the segment holds both."""
    tt.write(tmp_path, {"steps": tt.steps(3), "finished": finished_rows(2)})
    steps_as_committed_stream(tmp_path, {"finished": 2})
    assert tt.found(tmp_path, "trace.lost_rows") == []


# --- trace.unverified --------------------------------------------------------------------------

def test_unverified_parquet_without_checksums_or_counts(tmp_path):
    """Parquet written by another tool (as the format-1 samples were compacted): nothing to
    verify its bytes by, and no commit-marker counts for its rows: one note each, of every
    table's segment that holds a file."""
    tt.write(tmp_path, {"steps": tt.steps(3)})
    files = len(list((tmp_path / tt.ENGINE).glob("*/*.parquet")))
    assert tt.found(tmp_path, "trace.unverified") == [
        (None, None, f"{files} of {files} Parquet segment(s) carry no page checksums (written "
                     "before vllm-contract wrote them, or by another tool): bytes changed in them "
                     "cannot be detected"),
        (None, None, "1 of 1 steps segment(s) carry no row counts (recorded or compacted before "
                     "commit markers, or by another tool): rows lost from the other tables there "
                     "cannot be detected, only the steps' count is compared with the manifest")]


def test_unverified_stream_without_commit_markers(tmp_path):
    """A steps stream with checksummed batches but written before commit markers: still no
    row counts; the Parquet note counts the other tables' files alone."""
    tt.write(tmp_path, {"steps": tt.steps(3)})
    steps_as_stream(tmp_path)
    files = len(list((tmp_path / tt.ENGINE).glob("*/*.parquet")))
    found = [d.split(" carry ")[0] for _, _, d in tt.found(tmp_path, "trace.unverified")]
    assert found == [f"{files} of {files} Parquet segment(s)", "1 of 1 steps segment(s)"]


def test_unverified_recorded_and_compacted_says_nothing(tmp_path):
    """Near miss: what the recorder writes, live and compacted, carries both."""
    import readerkit as rk
    from vllm_contract.recorder.compact import compact
    from vllm_contract.trace import open_trace

    root = rk.as_streams("mixed", tmp_path / "t", segments=2)
    assert tt.found(root, "trace.unverified") == []
    compact(open_trace(root))
    assert tt.found(root, "trace.unverified") == []
    # one file rewritten by another tool: that one alone
    seg = rk.table_dir(root, "finished") / "000000.parquet"
    pq.write_table(pq.read_table(seg).replace_schema_metadata(None), seg)
    total = len(list(rk.engine_dir(root).glob("*/*.parquet")))
    assert tt.found(root, "trace.unverified") == [
        (None, None, f"1 of {total} Parquet segment(s) carry no page checksums (written before "
                     "vllm-contract wrote them, or by another tool): bytes changed in them cannot "
                     "be detected")]
