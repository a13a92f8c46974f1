"""Rows lost after they were written are an error finding, not silence: each damage below, on
a copy of a real recorded trace, once passed `check` with exit 0 and the output of the intact
trace (issue 29). A live segment's `steps` stream counts every other table's rows per flush in
its commit markers; those counts are what a lost, renamed or hidden segment fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import readerkit as rk
from vllm_contract import schema
from vllm_contract.recorder.compact import compact
from vllm_contract.replay.query.summary import INTEGRITY_CHECKS
from vllm_contract.trace import PAGE_CHECKSUMS_KEY, open_trace


errors = rk.errors


def assert_agree(root, invariant: str, *words: str) -> None:
    rk.assert_agree(root, invariant, *words, checks=INTEGRITY_CHECKS)


def as_format2(name: str, dst: Path, segments: int = 1) -> Path:
    """samples/NAME as live format-2 streams: TRACE/<table>/engine=N/, TRACE/_engines/engine=N/."""
    one = rk.as_streams(name, dst.with_name(dst.name + "-v1"), segments=segments)
    home = rk.engine_dir(one)
    dst.mkdir()
    for table in schema.TABLE_NAMES:
        (dst / table).mkdir()
        shutil.move(home / table, dst / table / home.name)
    manifest = json.loads((home / schema.MANIFEST).read_text())
    manifest["format_version"] = 2
    (dst / schema.ENGINES_DIR / home.name).mkdir(parents=True)
    (dst / schema.ENGINES_DIR / home.name / schema.MANIFEST).write_text(json.dumps(manifest))
    return dst


def killed(root: Path) -> None:
    """The manifest a SIGKILLed recorder leaves: never sealed, no step counted."""
    path = rk.engine_dir(root) / schema.MANIFEST
    m = json.loads(path.read_text())
    m.update(closed_cleanly=False, steps_recorded=0, pid=2 ** 22 + 7)
    path.write_text(json.dumps(m))


# A sample whose segment of each table holds rows (mixed records no multimodal input).
SAMPLE_OF = {"updates": "mixed", "model_outputs": "mixed", "finished": "mixed",
             "finish_events": "mixed", "preempted": "mixed", "scheduled": "mixed",
             "requests": "mixed", "mm_inputs": "encoder-lookalike",
             "freed_mm": "encoder-lookalike"}


@pytest.mark.parametrize("how", ["deleted", "renamed", "hidden"])
@pytest.mark.parametrize("table", sorted(SAMPLE_OF))
def test_a_tables_segment_gone(tmp_path, table, how):
    root = rk.as_streams(SAMPLE_OF[table], tmp_path / "t")
    seg = rk.table_dir(root, table) / "000000.arrows"
    if how == "deleted":
        seg.unlink()
    else:
        seg.rename(seg.with_name(".000000.arrows" if how == "hidden" else "000000.arrows.bak"))
    assert_agree(root, "trace.lost_rows", f"{table}/000000.arrows", "gone",
                 f"of table {table}")


@pytest.mark.parametrize("table", ["updates", "model_outputs", "finished", "mm_inputs"])
def test_a_compacted_tables_segment_gone(tmp_path, table):
    """Compaction carries the commit markers into the steps Parquet: a compacted segment lost
    is as plain as a live one."""
    root = rk.as_streams(SAMPLE_OF[table], tmp_path / "t", segments=2)
    compact(open_trace(root))
    seg = rk.table_dir(root, table) / "000001.parquet"
    seg.unlink()
    assert_agree(root, "trace.lost_rows", f"{table}/000001.parquet", "gone",
                 f"of table {table}")


def test_a_compacted_segment_cut_short(tmp_path):
    root = rk.as_streams("mixed", tmp_path / "t")
    compact(open_trace(root))
    seg = rk.table_dir(root, "model_outputs") / "000000.parquet"
    t = pq.read_table(seg)
    pq.write_table(t.slice(0, t.num_rows - 3), seg)
    assert_agree(root, "trace.lost_rows", "model_outputs/000000.parquet",
                 f"holds {t.num_rows - 3} of the {t.num_rows} row(s)")


@pytest.mark.parametrize("table", ["updates", "finished"])
def test_the_same_in_format_2(tmp_path, table):
    root = as_format2("mixed", tmp_path / "t")
    next((root / table).iterdir()).joinpath("000000.arrows").unlink()
    assert_agree(root, "trace.lost_rows", "gone", f"of table {table}")


def test_a_killed_traces_steps_segment_gone(tmp_path):
    # steps_recorded: 0, so trace.count_mismatch cannot see it; the other tables' rows can
    root = rk.as_streams("mixed", tmp_path / "t", segments=2)
    killed(root)
    (rk.table_dir(root, "steps") / "000001.arrows").unlink()
    assert "trace.count_mismatch" not in errors(root)
    assert_agree(root, "trace.lost_rows", "updates/000001.arrows", "segment 000001 of steps",
                 "is gone")


@pytest.mark.parametrize("cut, said", [(0, "is empty"), (6, "is torn before its schema")])
def test_a_killed_traces_steps_segment_emptied(tmp_path, cut, said):
    root = rk.as_streams("mixed", tmp_path / "t", segments=2)
    killed(root)
    seg = rk.table_dir(root, "steps") / "000000.arrows"
    seg.write_bytes(seg.read_bytes()[:cut])
    assert_agree(root, "trace.lost_rows", "updates/000000.arrows", said)


@pytest.mark.parametrize("keep", ["nothing", "schema", "some batches"])
def test_a_clean_traces_stream_truncated(tmp_path, keep):
    root = rk.as_streams("mixed", tmp_path / "t")
    seg = rk.table_dir(root, "updates") / "000000.arrows"
    data = seg.read_bytes()
    cut = {"nothing": 0, "schema": 4 + 4 + 20, "some batches": len(data) // 2}[keep]
    seg.write_bytes(data[:cut])
    assert_agree(root, "trace.lost_rows", "updates/000000.arrows", "of the 132 row(s)")
    warned = rk.invoke("info", root).stderr
    assert "no data lost" not in warned and "died before its first write" not in warned


@pytest.mark.parametrize("cut", [0, 6])
def test_a_killed_writers_empty_tables_say_nothing(tmp_path, cut):
    """A stream writer writes its schema with its first batch, so a table that never got a row
    stays empty until close, and a killed recorder (a `vllm serve` stopped hard) never closes.
    The commit markers count no row for it: nothing was lost, and no warning says otherwise;
    the same file beside a steps stream without markers is still reported."""
    root = rk.as_streams("mixed", tmp_path / "t")
    killed(root)
    seg = rk.table_dir(root, "mm_inputs") / "000000.arrows"
    assert open_trace(root).engines[0].committed_rows(seg) == 0
    seg.write_bytes(seg.read_bytes()[:cut])
    r = rk.invoke("check", root)
    assert r.exit_code == 0 and "vllm-contract: warning" not in r.stderr, r.stderr
    assert "trace.lost_rows" not in errors(root)
    assert "vllm-contract: warning" not in rk.invoke("info", root).stderr


def test_a_renamed_partition_in_format_2(tmp_path):
    root = as_format2("mixed", tmp_path / "t")
    (root / "updates" / rk.engine_dir(root).name).rename(root / "updates" / "engine=other")
    name = rk.engine_dir(root).name
    assert_agree(root, "trace.lost_rows", f"updates/{name}/000000.arrows", "gone")
    assert_agree(root, "trace.lost_rows", "updates/engine=other", "no manifest names")


def test_rows_under_a_partition_no_manifest_names(tmp_path):
    # compacted: no commit markers left, only the partition's name says something is wrong
    root = as_format2("mixed", tmp_path / "t")
    compact(open_trace(root))
    shutil.copytree(root / "finished" / rk.engine_dir(root).name, root / "finished" / "engine=x")
    assert_agree(root, "trace.lost_rows", "1 segment(s) of table finished", "engine x")


def test_every_transport_segment_duplicated(tmp_path):
    # No committed sample records transport (a live engine's hooks do): the sample's own
    # steps stand in for the hand-offs their executor would have recorded.
    root = rk.copy_sample("mixed", tmp_path / "t")
    steps = pq.read_table(rk.table_dir(root, "steps") / "000000.parquet")
    n = steps.num_rows
    rows = pa.table({"step": steps["step"], "event": pa.array(["executed"] * n),
                     "worker": pa.nulls(n, pa.int64()), "seq": steps["step"],
                     "t_ns": pc.add(steps["t_ns"], 1),
                     "num_scheduled_tokens": steps["total_num_scheduled_tokens"]})
    tdir = rk.table_dir(root, "transport")
    want = schema.schema("transport")
    rows = pa.table({f.name: rows[f.name] if f.name in rows.column_names
                     else pa.nulls(n, f.type) for f in want}).cast(want)
    pq.write_table(rows, tdir / "000000.parquet")
    assert "trace.duplicate_rows" not in errors(root)
    shutil.copy(tdir / "000000.parquet", tdir / "000001.parquet")
    assert_agree(root, "trace.duplicate_rows", "transport", f"{n} row(s)")


def test_parquet_marked_checksummed_without_checksums(tmp_path):
    root = rk.as_streams("mixed", tmp_path / "t")
    compact(open_trace(root))
    seg = rk.table_dir(root, "finished") / "000000.parquet"
    t = pq.read_table(seg)
    assert PAGE_CHECKSUMS_KEY in t.schema.metadata
    pq.write_table(t, seg, write_page_checksum=False)  # another tool, the marker kept
    assert_agree(root, "trace.checksum", "finished/000000.parquet", "pages have none")


@pytest.mark.parametrize("name", ["mixed", "encoder-lookalike"])
def test_intact_traces_lose_nothing(tmp_path, name):
    for root in (rk.as_streams(name, tmp_path / "st", segments=2), as_format2(name, tmp_path / "v2")):
        assert "trace.lost_rows" not in errors(root)
        assert rk.integrity(root) == []
        compact(open_trace(root))
        assert "trace.lost_rows" not in errors(root) and rk.integrity(root) == []


@pytest.mark.parametrize("name", ["mixed", "encoder-lookalike"])
def test_info_and_check_say_the_same_of_what_cannot_be_verified(tmp_path, name):
    """A format-1 sample (compacted before checksums and commit markers): `check`'s
    trace.unverified notes are `info`'s unverified lines, word for word, and its integrity
    line stays OK; the same trace rewritten by the recorder's own writer has none."""
    sample = rk.copy_sample(name, tmp_path / "s")
    notes = [f["message"].split(": ", 1)[1] for f in rk.findings(sample, "trace.unverified")]
    assert len(notes) == 2
    r = rk.invoke("info", sample, "--format", "json")
    (e,) = json.loads(r.stdout)["engines"]
    assert e["unverified"] == notes and e["integrity"] == []
    text = rk.invoke("info", sample).stdout.splitlines()
    assert [ln.split(None, 1)[1] for ln in text if ln.startswith("unverified")] == notes
    assert "integrity     OK" in text
    rewritten = rk.as_streams(name, tmp_path / "t")
    assert rk.findings(rewritten, "trace.unverified") == []
    (e,) = json.loads(rk.invoke("info", rewritten, "--format", "json").stdout)["engines"]
    assert e["unverified"] == []
