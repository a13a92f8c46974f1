"""Corruption is a finding: each damage below once passed `check` with exit 0. Now each is an
error finding of a trace.* integrity check, and `info`'s integrity line names the same one."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import readerkit as rk
from vllm_contract import schema
from vllm_contract.recorder.compact import compact
from vllm_contract.trace import open_trace

INTEGRITY = ("trace.checksum", "trace.count_mismatch", "trace.duplicate_rows",
             "trace.impossible_steps", "trace.lost_rows")


errors = rk.errors


def assert_agree(root, invariant: str, *words: str) -> None:
    rk.assert_agree(root, invariant, *words, checks=INTEGRITY)


def rewrite_parquet(path, fn) -> None:
    t = pq.read_table(path)
    pq.write_table(fn(t), path)


@pytest.mark.parametrize("name", ["mixed", "spec-decode", "mixed-async"])
def test_clean_samples_have_no_integrity_finding(name, tmp_path):
    for root in (rk.copy_sample(name, tmp_path / "pq"), rk.as_streams(name, tmp_path / "st")):
        assert not set(errors(root)) & set(INTEGRITY)
        assert rk.integrity(root) == []


def test_steps_segment_copied_to_a_second_number(tmp_path):
    root = rk.as_streams("mixed", tmp_path / "t")
    steps = rk.table_dir(root, "steps")
    shutil.copy(steps / "000000.arrows", steps / "000001.arrows")
    assert_agree(root, "trace.duplicate_rows", "steps", "132 row(s)")
    assert "trace.count_mismatch" in errors(root)  # 264 rows where 132 were written
    assert not any("missing" in i for i in rk.integrity(root))  # once: "-132 missing"


def test_finish_events_segment_duplicated(tmp_path):
    root = rk.copy_sample("mixed", tmp_path / "t")
    fe = rk.table_dir(root, "finish_events")
    shutil.copy(fe / "000000.parquet", fe / "000001.parquet")
    assert_agree(root, "trace.duplicate_rows", "finish_events", "10 row(s)")


@pytest.mark.parametrize("first", [-5, 1 << 40])
def test_updates_with_impossible_steps(tmp_path, first):
    root = rk.copy_sample("mixed", tmp_path / "t")
    seg = rk.table_dir(root, "updates") / "000000.parquet"
    step = -1 if first < 0 else 1
    rewrite_parquet(seg, lambda t: t.set_column(
        0, "step", pa.array([first + step * i for i in range(t.num_rows)], pa.int64())))
    assert_agree(root, "trace.impossible_steps", "updates", "132 row(s)", str(first))


def test_requests_with_negative_steps(tmp_path):
    root = rk.copy_sample("mixed", tmp_path / "t")
    seg = rk.table_dir(root, "requests") / "000000.parquet"
    rewrite_parquet(seg, lambda t: t.set_column(0, "step", pc.subtract(t["step"], 100)))
    assert_agree(root, "trace.impossible_steps", "requests")


def test_an_abort_before_the_first_step_is_possible(tmp_path):
    """Near miss: finish_events step -1 is an abort before the first recorded step."""
    root = rk.copy_sample("mixed", tmp_path / "t")
    seg = rk.table_dir(root, "finish_events") / "000000.parquet"
    rewrite_parquet(seg, lambda t: t.set_column(
        0, "step", pa.array([-1] + t["step"].to_pylist()[1:], pa.int64())))
    assert "trace.impossible_steps" not in errors(root)


def _t_ns_offset(data: bytes) -> int:
    """Where a step's t_ns (a value no metadata holds) lies in a stream segment."""
    t = ipc.open_stream(pa.py_buffer(data)).read_all()
    needle = t["t_ns"][len(t) // 2].as_py().to_bytes(8, "little")
    at = data.find(needle)
    assert at > 0
    return at


def test_one_flipped_byte_in_a_stream(tmp_path):
    root = rk.as_streams("mixed", tmp_path / "t")
    seg = rk.table_dir(root, "steps") / "000000.arrows"
    data = bytearray(seg.read_bytes())
    data[_t_ns_offset(bytes(data)) + 5] ^= 0x10
    seg.write_bytes(bytes(data))
    assert_agree(root, "trace.checksum", "steps/000000.arrows", "1 of ", "batches fail their checksum")


def test_one_flipped_byte_in_a_parquet_page(tmp_path):
    root = rk.as_streams("mixed", tmp_path / "t")
    compact(open_trace(root))
    seg = rk.table_dir(root, "scheduled") / "000000.parquet"
    col = pq.ParquetFile(seg).metadata.row_group(0).column(0)
    good = seg.read_bytes()
    # the first byte, from the back of the step column's pages, whose flip the page checksum
    # catches (a flip in a page header is a file that does not parse, another test's case)
    for at in range(col.data_page_offset + col.total_compressed_size - 1,
                    col.data_page_offset, -1):
        data = bytearray(good)
        data[at] ^= 0x01
        seg.write_bytes(bytes(data))
        try:
            pq.read_table(seg, page_checksum_verification=True)
        except (OSError, pa.ArrowException) as e:
            if "CRC" in str(e):
                break
    else:
        pytest.fail("no flip in the step column failed its page checksum")
    assert_agree(root, "trace.checksum", "scheduled/000000.parquet")
    assert open_trace(root).engines[0].read("scheduled").num_rows == 186  # rows still read


def test_compaction_leaves_a_damaged_stream_as_it_is(tmp_path):
    """A Parquet file made from damaged rows would carry fresh checksums: the damage would
    vanish. The stream stays, and still fails its checksum."""
    root = rk.as_streams("mixed", tmp_path / "t")
    seg = rk.table_dir(root, "steps") / "000000.arrows"
    data = bytearray(seg.read_bytes())
    data[_t_ns_offset(bytes(data)) + 2] ^= 0x01
    seg.write_bytes(bytes(data))
    stats = compact(open_trace(root))
    assert stats["skipped_damaged"] == 1 and seg.exists()
    assert not seg.with_suffix(".parquet").exists()
    assert "trace.checksum" in errors(root)


def test_no_steps_on_disk_where_the_manifest_counts_some(tmp_path):
    root = rk.copy_sample("mixed", tmp_path / "t")
    edir = rk.engine_dir(root)
    pq.write_table(schema.schema("steps").empty_table(), schema.table_dir(edir, "steps") / "000000.parquet")
    m = json.loads((edir / schema.MANIFEST).read_text())
    m["closed_cleanly"] = False
    (edir / schema.MANIFEST).write_text(json.dumps(m))
    assert_agree(root, "trace.count_mismatch", "132 steps written", "holds 0")


def test_fewer_steps_after_a_recorder_error_are_no_mismatch(tmp_path):
    """Near miss: after a recorder error, counted but unwritten rows are expected."""
    root = rk.copy_sample("mixed", tmp_path / "t")
    edir = rk.engine_dir(root)
    m = json.loads((edir / schema.MANIFEST).read_text())
    m.update(closed_cleanly=False, steps_recorded=140,
             recorder_errors=[{"time": 1.0, "error": "OSError: disk full"}])
    (edir / schema.MANIFEST).write_text(json.dumps(m))
    assert "trace.count_mismatch" not in errors(root)


def test_checksums_cost_little(tmp_path):
    """The recorder's writer checksums each batch as it writes it; the samples' batches take
    well under a millisecond each (the writer's own work per batch is far more)."""
    import time

    from vllm_contract.trace import batch_checksum

    t = open_trace(rk.SAMPLES / "mixed").engines[0].read("scheduled")
    batch = t.to_batches()[0]
    start = time.perf_counter()
    for _ in range(100):
        batch_checksum(batch)
    assert (time.perf_counter() - start) / 100 < 1e-3


def test_the_recorder_stamps_every_batch(tiny_model, tmp_path):
    """A real recording: every batch of every stream carries its checksum, which holds; one
    flipped byte in it is then a finding."""
    from vllm_contract.rig import scenarios
    from vllm_contract.trace import CHECKSUM_KEY, batch_checksum

    scenarios.run("preemption", tiny_model, tmp_path, flush_steps=4)
    streams = sorted(tmp_path.rglob("*.arrows"))
    batches = 0
    for path in streams:
        if not path.stat().st_size:
            continue
        reader = ipc.open_stream(pa.py_buffer(path.read_bytes()))
        while True:
            try:
                batch, meta = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            assert meta[CHECKSUM_KEY] == batch_checksum(batch)
            batches += 1
    assert batches > 20
    assert "trace.checksum" not in errors(tmp_path)
    seg = rk.table_dir(tmp_path, "steps") / "000000.arrows"
    data = bytearray(seg.read_bytes())
    data[_t_ns_offset(bytes(data)) + 3] ^= 0x04
    seg.write_bytes(bytes(data))
    assert_agree(tmp_path, "trace.checksum", str(seg.relative_to(tmp_path)))
