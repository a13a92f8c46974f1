"""`vllm-contract compact` on a real multi-segment trace: lossless, idempotent, crash-tolerant."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from readerkit import engine_dir, table_dir
from vllm_contract import schema
from vllm_contract.cli import app
from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios


@pytest.fixture(scope="module")
def recorded(tiny_model, tmp_path_factory) -> Path:
    """A real harness trace rotated into several small segments per table."""
    root = tmp_path_factory.mktemp("recorded")
    scenarios.run("preemption", tiny_model, root, segment_bytes=4096, flush_steps=8)
    return root


@pytest.fixture
def trace(recorded, tmp_path) -> Path:
    dst = tmp_path / "trace"
    shutil.copytree(recorded, dst)
    return dst


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def read_all(root: Path) -> dict:
    t = open_trace(root)
    tables = {name: t.read(name) for name in schema.TABLE_NAMES}
    assert t.warnings == []
    return tables


def files(root: Path, suffix: str) -> list[Path]:
    return sorted(p for p in root.rglob(f"*{suffix}") if p.is_file())


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_tables(got: dict, want: dict) -> None:
    for name in schema.TABLE_NAMES:
        assert got[name].schema == want[name].schema, name
        assert got[name].num_rows == want[name].num_rows, name
        assert got[name].equals(want[name]), f"table {name} changed"


def test_compact_is_lossless_and_idempotent(trace):
    e = engine_dir(trace)
    streams = files(trace, schema.SEGMENT_SUFFIX)
    for name in schema.TABLE_NAMES:
        assert len(list(schema.table_dir(e, name).glob(f"*{schema.SEGMENT_SUFFIX}"))) >= 3, name
    before = read_all(trace)
    assert before["steps"].num_rows > 20 and before["scheduled"].num_rows > 0

    r = invoke("compact", trace)
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert re.search(rf"^compacted {len(streams)} segment\(s\)", r.stdout, re.M), r.stdout
    assert "live" not in r.stdout
    assert not [ln for ln in r.stderr.splitlines() if "warning" in ln or "error" in ln]
    # stderr is no terminal here (a log, a pipe): progress in plain lines, the last one whole
    assert "\r" not in r.stderr
    assert r.stderr.splitlines()[-1] == f"compacting {len(streams)}/{len(streams)}"

    assert files(trace, schema.SEGMENT_SUFFIX) == []
    parquet = files(trace, schema.PARQUET_SUFFIX)
    assert [p.with_suffix("") for p in parquet] == [p.with_suffix("") for p in streams]
    # No temporary files are left behind.
    assert [p for p in trace.rglob("*") if p.name.startswith(".")] == []
    # Zstd, as documented.
    codecs = {pq.ParquetFile(p).metadata.row_group(0).column(0).compression
              for p in parquet if pq.ParquetFile(p).metadata.num_row_groups}
    assert codecs == {"ZSTD"}

    after = read_all(trace)
    assert_same_tables(after, before)

    # Again: nothing to do, nothing touched.
    snap = snapshot(trace)
    r = invoke("compact", trace)
    assert r.exit_code == 0, r.output
    assert re.search(r"^compacted 0 segment\(s\)", r.stdout, re.M), r.stdout
    assert snapshot(trace) == snap
    assert_same_tables(read_all(trace), before)

    # info still agrees with the data.
    r = invoke("info", trace, "-f", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["engines"][0]["rows"] == {
        n: t.num_rows for n, t in before.items()}


def test_leftover_stream_beside_its_parquet_is_read_once(trace, tmp_path):
    """A crash between the Parquet's rename and the stream's unlink leaves both files."""
    saved = tmp_path / "saved"
    shutil.copytree(trace, saved)
    before = read_all(trace)

    r = invoke("compact", trace)
    assert r.exit_code == 0, r.output
    e, saved_e = engine_dir(trace), engine_dir(saved)
    restored = []
    for name in schema.TABLE_NAMES:
        src = schema.table_dir(saved_e, name) / f"000000{schema.SEGMENT_SUFFIX}"
        dst = schema.table_dir(e, name) / src.name
        assert dst.with_suffix(schema.PARQUET_SUFFIX).exists()
        shutil.copy2(src, dst)
        restored.append(dst)
    assert all(p.exists() for p in restored)

    after = read_all(trace)
    assert after["steps"].num_rows == before["steps"].num_rows
    assert_same_tables(after, before)
    assert after["steps"]["step"].to_pylist() == sorted(set(after["steps"]["step"].to_pylist()))

    r = invoke("info", trace, "-f", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["engines"][0]["steps"] == before["steps"].num_rows

    # Compacting the leftover state keeps the data intact too.
    r = invoke("compact", trace)
    assert r.exit_code == 0, r.output
    assert_same_tables(read_all(trace), before)


def test_live_writer_keeps_its_newest_segment(trace):
    """A manifest that is not closed, naming this (alive) process on this host: the newest segment
    of each table is still being appended to and must stay a stream."""
    e = engine_dir(trace)
    mpath = e / schema.MANIFEST
    manifest = json.loads(mpath.read_text())
    assert manifest["pid"] == os.getpid()  # recorded in-process by the harness
    manifest["closed_cleanly"] = False
    mpath.write_text(json.dumps(manifest))
    before = read_all(trace)
    newest = {name: sorted(schema.table_dir(e, name).glob(f"*{schema.SEGMENT_SUFFIX}"))[-1]
              for name in schema.TABLE_NAMES}

    r = invoke("compact", trace)
    assert r.exit_code == 0, r.output
    assert re.search(rf"left {len(schema.TABLE_NAMES)} live segment\(s\)", r.stdout), r.stdout
    assert files(trace, schema.SEGMENT_SUFFIX) == sorted(newest.values())
    assert_same_tables(read_all(trace), before)


def test_unreadable_segment_fails_cleanly(trace):
    """A segment of random bytes: exit 2, and the error is a line of its own, not glued to the
    progress output that precedes it."""
    bad = table_dir(trace, "scheduled") / f"000001{schema.SEGMENT_SUFFIX}"
    bad.write_bytes(os.urandom(bad.stat().st_size))

    r = invoke("compact", trace)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert r.stdout == ""
    errors = [ln for ln in r.stderr.split("\n") if "vllm-contract: error:" in ln]
    assert len(errors) == 1, repr(r.stderr)
    assert errors[0].startswith("vllm-contract: error:"), repr(r.stderr)
    assert str(bad) in errors[0]
    # Whatever was compacted before the failure still reads back (the bad segment aside).
    t = open_trace(trace)
    assert t.read("steps").num_rows > 0
