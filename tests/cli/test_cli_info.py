"""`vllm-contract info` on real recorded traces: counts, JSON, bad input, torn segments."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from typer.testing import CliRunner

from readerkit import engine_dir, table_dir
from vllm_contract import schema
from vllm_contract.cli import app
from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios

from readerkit import assert_clean_failure


@pytest.fixture(scope="module")
def recorded(tiny_model, tmp_path_factory) -> Path:
    """One real harness trace with many small batches per steps segment (flush every 4 steps)."""
    root = tmp_path_factory.mktemp("recorded")
    scenarios.run("preemption", tiny_model, root, flush_steps=4)
    return root


@pytest.fixture
def trace(recorded, tmp_path) -> Path:
    """A private copy of the recorded trace, free to damage."""
    dst = tmp_path / "trace"
    shutil.copytree(recorded, dst)
    return dst


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def steps_shown(stdout: str) -> int:
    m = re.search(r"^steps\s+(\d+)\b", stdout, re.M)
    assert m, f"no steps line in:\n{stdout}"
    return int(m.group(1))


def integrity_line(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("integrity")]
    assert len(lines) == 1, stdout
    return lines[0]


# -- a good trace --------------------------------------------------------------------------------

def test_info_counts_match_the_trace(trace):
    t = open_trace(trace)
    steps = t.read("steps").num_rows
    rows = {name: t.read(name).num_rows for name in schema.TABLE_NAMES}
    assert steps > 20 and rows["scheduled"] > 0 and rows["preempted"] > 0  # a real workload

    r = invoke("info", trace)
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    assert steps_shown(r.stdout) == steps
    assert integrity_line(r.stdout).split(None, 1)[1] == "OK"
    shown_rows = dict(kv.split("=") for kv in
                      re.search(r"^rows\s+(.*)$", r.stdout, re.M).group(1).split())
    assert {k: int(v) for k, v in shown_rows.items()} == rows

    r = invoke("info", trace, "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data["engines"]) == 1
    e = data["engines"][0]
    assert e["steps"] == steps
    assert e["rows"] == rows
    assert e["closed_cleanly"] is True
    assert e["integrity"] == [] and e["warnings"] == []
    assert e["format_version"] == schema.FORMAT_VERSION

    # One engine directory opened directly gives the same answer as its root.
    r = invoke("info", engine_dir(trace), "-f", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["engines"][0]["rows"] == rows


def test_info_reads_only_what_it_sums(trace, monkeypatch):
    """Row counts come from Parquet footers, and of the tables only a few small columns are
    read: read whole, a million-step trace took 10 GB. Counts are the same either way, on
    stream segments and after compaction."""
    from vllm_contract.recorder.compact import compact
    from vllm_contract.replay.query.summary import summary
    from vllm_contract.trace import EngineTrace

    for compacted in (False, True):
        if compacted:
            compact(open_trace(trace))
            assert not list(trace.rglob("*" + schema.SEGMENT_SUFFIX))
        (e,) = open_trace(trace).engines
        assert {t: e.count(t) for t in schema.TABLE_NAMES} == {
            t: e.read(t).num_rows for t in schema.TABLE_NAMES}
    reads = []
    real = EngineTrace.read

    def spy(self, table, columns=None):
        reads.append((table, columns))
        return real(self, table, columns)

    monkeypatch.setattr(EngineTrace, "read", spy)
    summary(open_trace(trace))
    assert reads and all(columns for _, columns in reads), reads
    assert {t for t, _ in reads} <= {"steps", "requests", "updates"}


@pytest.mark.parametrize("batch_queue", [1, 2])
def test_batches_in_flight(batch_queue, tiny_model, tmp_path):
    """How many batches the engine had in flight: per update, the schedule() calls from its own
    step on that had returned before it (counted here from the raw timestamps)."""
    scenarios.run("preemption", tiny_model, tmp_path, batch_queue=batch_queue)
    t = open_trace(tmp_path)
    returned = {r["step"]: r["t_ns"] for r in t.read("steps").to_pylist()}
    in_flight = [sum(1 for s, at in returned.items() if s >= u["step"] and at < u["t_ns"])
                 for u in t.read("updates").to_pylist()]
    r = invoke("info", tmp_path, "--format", "json")
    e = json.loads(r.stdout)["engines"][0]
    assert e["most_in_flight"] == max(in_flight) == batch_queue
    assert e["overlapped_updates"] == sum(n > 1 for n in in_flight)
    assert (e["overlapped_updates"] > 0) == (batch_queue > 1)
    line = next(ln for ln in invoke("info", tmp_path).stdout.splitlines()
                if ln.startswith("batches"))
    assert line.split(None, 1)[1] == ("one at a time" if batch_queue == 1 else
                                      f"up to 2 in flight ({e['overlapped_updates']} of "
                                      f"{e['rows']['updates']} updates came after the next "
                                      "schedule())")


# -- unusable input: exit 2, one line, no traceback -------------------------------------------------

def test_missing_directory(tmp_path):
    line = assert_clean_failure(invoke("info", tmp_path / "nope"))
    assert "nope" in line


def test_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    assert ": empty: " in assert_clean_failure(invoke("info", tmp_path / "empty"))
    # files, but no trace: not called empty
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    line = assert_clean_failure(invoke("info", tmp_path / "other"))
    assert ": not a vllm-contract trace: " in line and ": empty" not in line


def test_random_bytes_manifest(tmp_path):
    d = tmp_path / "garbage"
    d.mkdir()
    (d / schema.MANIFEST).write_bytes(os.urandom(512))
    assert_clean_failure(invoke("info", d))


def test_newer_format_version(trace):
    mpath = engine_dir(trace) / schema.MANIFEST
    manifest = json.loads(mpath.read_text())
    manifest["format_version"] = schema.FORMAT_VERSION + 1
    mpath.write_text(json.dumps(manifest))
    line = assert_clean_failure(invoke("info", trace))
    assert str(schema.FORMAT_VERSION + 1) in line


@pytest.mark.parametrize("table", ["steps", "finish_events"])
def test_segment_of_random_bytes(trace, table):
    seg = table_dir(trace, table) / f"000000{schema.SEGMENT_SUFFIX}"
    assert seg.stat().st_size > 0
    seg.write_bytes(os.urandom(seg.stat().st_size))
    line = assert_clean_failure(invoke("info", trace))
    assert str(seg.relative_to(trace)) in line


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/full"])
def test_segment_that_is_a_device(trace, device):
    """A segment symlinked to an endless device is refused at once, not read until memory
    runs out (the recorder's own fault injection leaves such links behind)."""
    seg = table_dir(trace, "steps") / f"000000{schema.SEGMENT_SUFFIX}"
    seg.unlink()
    seg.symlink_to(device)
    line = assert_clean_failure(invoke("info", trace))
    assert "not a regular file" in line and str(seg.relative_to(trace)) in line


def test_regular_file(tmp_path):
    f = tmp_path / "trace.arrows"
    f.write_bytes(b"not a directory")
    assert_clean_failure(invoke("info", f))


# -- damaged but usable --------------------------------------------------------------------------

def _batch_ends(data: bytes) -> tuple[pa.Schema, list[tuple[int, int]]]:
    """(schema, [(end offset, rows)] for each record batch message) of a whole stream segment."""
    buf = pa.BufferReader(pa.py_buffer(data))
    messages = ipc.MessageReader.open_stream(buf)
    sch = ipc.read_schema(messages.read_next_message())
    ends = []
    while True:
        try:
            msg = messages.read_next_message()
        except StopIteration:
            break
        assert msg.type == "record batch"
        ends.append((buf.tell(), ipc.read_record_batch(msg, sch).num_rows))
    return sch, ends


def _truncate_mid_last_batch(trace: Path) -> tuple[Path, int]:
    """Cut steps/000000.arrows in the middle of its last batch; return it and the rows kept."""
    seg = table_dir(trace, "steps") / f"000000{schema.SEGMENT_SUFFIX}"
    data = seg.read_bytes()
    _, ends = _batch_ends(data)
    assert len(ends) >= 3, "the recording should hold several batches"
    start, end = ends[-2][0], ends[-1][0]
    cut = (start + end) // 2
    assert start < cut < end
    seg.write_bytes(data[:cut])
    # Independently: the whole batches that end at or before the cut.
    kept = sum(rows for off, rows in ends if off <= cut)
    assert kept == sum(rows for _, rows in ends[:-1]) and kept > 0
    return seg, kept


def test_truncated_segment_keeps_whole_batches(trace):
    total = open_trace(trace).read("steps").num_rows
    seg, kept = _truncate_mid_last_batch(trace)
    assert kept < total

    r = invoke("info", trace)
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if "truncated after" in ln]
    assert warnings, r.stderr
    assert all(ln.startswith("vllm-contract: warning:") and str(seg) in ln for ln in warnings)
    # the torn steps batch was the flush's commit: the other tables' rows of that flush go too
    cut = [ln for ln in r.stderr.splitlines() if "of a flush the writer did not finish" in ln]
    assert cut and all(seg.parent.name in ln for ln in cut), r.stderr  # the same engine
    assert "Traceback" not in r.output
    assert steps_shown(r.stdout) == kept
    assert "segment warning" in integrity_line(r.stdout).split(None, 1)[1]

    r = invoke("info", trace, "-f", "json")
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)["engines"][0]
    assert e["steps"] == kept
    assert e["rows"]["steps"] == kept
    assert any("truncated" in w for w in e["warnings"])


def test_truncated_segment_is_warned_about_once(trace):
    """One torn segment is one warning: summary must not report it once per read of the table
    (nor the rows its torn flush takes out of each other table)."""
    seg, _ = _truncate_mid_last_batch(trace)
    r = invoke("info", trace)
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert len([ln for ln in lines if "truncated after" in ln]) == 1, r.stderr
    cut = [ln for ln in lines if "of a flush the writer did not finish" in ln]
    assert len(cut) == len(set(cut)), r.stderr
    assert f"{1 + len(cut)} segment warning(s)" in integrity_line(r.stdout)


def test_not_closed_cleanly(trace):
    mpath = engine_dir(trace) / schema.MANIFEST
    manifest = json.loads(mpath.read_text())
    manifest["closed_cleanly"] = False
    mpath.write_text(json.dumps(manifest))
    steps = open_trace(trace).read("steps").num_rows

    r = invoke("info", trace)
    assert r.exit_code == 0, r.output
    assert "not closed cleanly" in integrity_line(r.stdout)
    assert steps_shown(r.stdout) == steps

    r = invoke("info", trace, "-f", "json")
    e = json.loads(r.stdout)["engines"][0]
    assert e["closed_cleanly"] is False
    assert any("not closed cleanly" in i for i in e["integrity"])


# -- help ----------------------------------------------------------------------------------------

def test_command_list_rewraps_each_summary():
    """The summaries are docstrings wrapped at 100 columns in the source: on a wide terminal each
    must read as one line, not keep the source's breaks."""
    import inspect

    result = CliRunner().invoke(app, ["--help"], terminal_width=400, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    lines = [re.sub(r"[│\s]+", " ", ln).strip() for ln in result.stdout.splitlines()]
    for cmd in app.registered_commands:
        name = cmd.name or cmd.callback.__name__
        summary = " ".join(inspect.getdoc(cmd.callback).split("\n\n")[0].split())
        summary = summary.replace("`", "")  # code spans lose their ticks when rendered
        assert f"{name} {summary}" in lines, (name, summary, result.stdout)
