"""Only regular files inside the trace are opened: a pipe in place of the manifest or a
Parquet segment once made `info`, `check` and `sql` wait forever; links out of the trace, a
directory in place of a file and a table of the wrong schema once gave tracebacks."""

from __future__ import annotations

import os
import shutil

import pytest

import readerkit as rk
from vllm_contract import schema
from vllm_contract.trace import open_trace

COMMANDS = ("info", "check", "sql")


@pytest.fixture(params=["parquet", "streams"])
def trace(request, tmp_path):
    if request.param == "parquet":
        return rk.copy_sample("mixed", tmp_path / "t")
    return rk.as_streams("mixed", tmp_path / "t")


def seg(root, table="steps"):
    (p,) = (rk.table_dir(root, table)).iterdir()
    return p


def refused(root, *words: str) -> None:
    for command in COMMANDS:
        line = rk.assert_clean_failure(rk.run_command(command, root, seconds=30))
        assert all(w in line for w in words), line


def test_manifest_is_a_pipe(trace):
    m = rk.engine_dir(trace) / schema.MANIFEST
    m.unlink()
    os.mkfifo(m)
    refused(trace, "not a regular file", schema.MANIFEST)


def test_segment_is_a_pipe(trace):
    p = seg(trace)
    p.unlink()
    os.mkfifo(p)
    refused(trace, "not a regular file", f"steps/{p.name}")


def test_manifest_is_a_directory(trace):
    m = rk.engine_dir(trace) / schema.MANIFEST
    m.unlink()
    m.mkdir()
    refused(trace, "not a regular file", schema.MANIFEST)


def test_segment_is_a_directory(trace):
    p = seg(trace)
    p.unlink()
    p.mkdir()
    refused(trace, "not a regular file", f"steps/{p.name}")


def test_table_directory_links_out_of_the_trace(trace, tmp_path):
    tdir = rk.table_dir(trace, "steps")
    shutil.move(tdir, tmp_path / "elsewhere")
    tdir.symlink_to(tmp_path / "elsewhere")
    refused(trace, "outside the trace")


def test_engine_directory_links_out_of_the_trace(trace, tmp_path):
    edir = rk.engine_dir(trace)
    shutil.move(edir, tmp_path / "elsewhere")
    edir.symlink_to(tmp_path / "elsewhere")
    refused(trace, "outside the trace")


def test_segment_links_out_of_the_trace(trace, tmp_path):
    p = seg(trace)
    shutil.move(p, tmp_path / p.name)
    p.symlink_to(tmp_path / p.name)
    refused(trace, "outside the trace")


def test_link_inside_the_trace_is_read(trace):
    """Near miss: a segment linked to a file elsewhere in the same trace reads as that file."""
    p = seg(trace)
    keep = trace / "kept" / p.name
    keep.parent.mkdir()
    shutil.move(p, keep)
    p.symlink_to(keep)
    assert rk.run_command("check", trace).exit_code == 0
    assert open_trace(trace).read("steps").num_rows == 132


def test_table_of_the_wrong_schema(trace):
    shutil.copy(seg(trace, "requests"), seg(trace, "steps"))
    refused(trace, "steps/", "not a segment of table steps")


def test_messages_are_one_line(trace):
    """pyarrow's message for a stream that is not one spans lines; the error does not."""
    p = seg(trace)
    p.write_bytes(b"\xff\xff\xff\xff\x10\x00\x00\x00" + os.urandom(4096))
    refused(trace, f"steps/{p.name}")


def test_torn_inside_the_schema_is_a_warning_and_a_damaged_schema_an_error(tmp_path):
    """A writer killed while starting a segment leaves a prefix of its schema message: no rows,
    a warning. A whole schema message with a byte changed is damage, not a tear."""
    from vllm_contract.errors import TraceError
    from vllm_contract.trace import read_segment

    root = rk.as_streams("mixed", tmp_path / "t")
    p = seg(root)
    data = p.read_bytes()
    end = 8 + int.from_bytes(data[4:8], "little")
    for cut in (1, 4, 7, 8, end // 2, end - 1):
        p.write_bytes(data[:cut])
        warnings: list[str] = []
        assert read_segment(p, warnings) is None
        assert len(warnings) == 1 and "torn before its schema" in warnings[0]
    p.write_bytes(data[:8] + b"\x00" * (end - 8) + data[end:])
    with pytest.raises(TraceError, match="not an Arrow stream segment"):
        read_segment(p, [])
    # the end-of-stream marker alone, as a writer whose schema write hit a full disk leaves
    # it when closed (tests/recorder/test_full_disk.py makes one at some fill points)
    p.write_bytes(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    warnings = []
    assert read_segment(p, warnings) is None
    assert len(warnings) == 1 and "closed before its schema was written" in warnings[0]


def test_wrong_table_read_by_columns_through_the_api(tmp_path):
    """Reading a few columns of a Parquet segment of another table is the same one-line error
    as reading it whole, not a checksum problem."""
    from vllm_contract.errors import TraceError

    root = rk.copy_sample("mixed", tmp_path / "t")
    shutil.copy(seg(root, "requests"), seg(root, "steps"))
    (e,) = open_trace(root).engines
    with pytest.raises(TraceError, match="not a segment of table steps"):
        e.read("steps", ["step", "t_ns"])
    assert e.problems == []
