"""Format 2: every table of a trace is one Hive-partitioned dataset (TRACE/<table>/engine=NAME/)
that pyarrow.dataset, pandas and polars read as they are, with an `engine` column holding the
names `check` prints; format 1 traces (the committed samples) stay readable."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from readerkit import SAMPLES
from vllm_contract import schema
from vllm_contract.recorder.compact import compact
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.rig import scenarios
from vllm_contract.trace import open_trace


@pytest.fixture(scope="module")
def fleet(tiny_model, tmp_path_factory) -> Path:
    """Three real-scheduler runs recorded into one root, compacted to Parquet."""
    root = tmp_path_factory.mktemp("fleet")
    for name in ("preemption", "aborts", "chunked_prefill"):
        scenarios.run(name, tiny_model, root)
    compact(open_trace(root))
    return root


def _by_engine(t: pa.Table, sort: list[str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in t.to_pylist():
        out.setdefault(str(r.pop("engine")), []).append(r)
    return {k: sorted(v, key=lambda r: [str(r[c]) for c in sort]) for k, v in out.items()}


def test_layout_is_one_dataset_per_table_and_manifests_apart(fleet):
    trace = open_trace(fleet)
    names = [e.name for e in trace.engines]
    assert len(set(names)) == 3 and not any(n.startswith("engine=") for n in names)
    for e in trace.engines:
        assert e.dir == fleet / schema.ENGINES_DIR / f"engine={e.name}"
        assert json.loads((e.dir / schema.MANIFEST).read_text())["format_version"] == (
            schema.FORMAT_VERSION)
    assert sorted(p.name for p in fleet.iterdir()) == sorted(
        [schema.ENGINES_DIR, *schema.TABLE_NAMES])
    for table in schema.TABLE_NAMES:
        assert sorted(p.name for p in (fleet / table).iterdir()) == sorted(
            f"engine={n}" for n in names)


@pytest.mark.parametrize("table", schema.TABLE_NAMES)
def test_pyarrow_dataset_reads_each_table_as_the_reader_does(fleet, table):
    mine = open_trace(fleet).read(table)
    theirs = ds.dataset(fleet / table, format="parquet", partitioning="hive").to_table()
    assert theirs.num_rows == mine.num_rows
    cols = [c for c in schema.schema(table).names]
    assert _by_engine(theirs.select(cols + ["engine"]), cols) == _by_engine(mine, cols)


def test_pandas_and_polars_read_a_table_of_all_engines(fleet):
    import pandas as pd
    import polars as pl

    mine = open_trace(fleet).read("scheduled")
    want = {e: len(rows) for e, rows in _by_engine(mine, ["step"]).items()}
    df = pd.read_parquet(fleet / "scheduled")
    assert {str(k): v for k, v in df.groupby("engine", observed=True).size().items()} == want
    lf = pl.scan_parquet(fleet / "scheduled" / "**" / "*.parquet", hive_partitioning=True)
    got = lf.group_by("engine").len().collect()
    assert dict(zip(got["engine"].to_list(), got["len"].to_list())) == want


def test_check_names_engines_as_the_datasets_do(fleet):
    with Gateway(fleet) as gw:
        engines = {r["engine"] for r in gw.sql("SELECT DISTINCT engine FROM scheduled").to_pylist()}
    partitions = set(ds.dataset(fleet / "scheduled", partitioning="hive").to_table(
        columns=["engine"]).column("engine").to_pylist())
    assert engines == partitions == {e.name for e in open_trace(fleet).engines}


def test_one_engine_home_opens_alone(fleet):
    (home,) = [e.dir for e in open_trace(fleet).engines][:1]
    (e,) = open_trace(home).engines
    assert e.read("steps").num_rows == open_trace(fleet).engines[0].read("steps").num_rows > 0


def test_format_1_samples_still_read():
    for sample in ("mixed", "broken-leak"):
        (e,) = open_trace(SAMPLES / sample).engines
        assert e.manifest["format_version"] == 1
        assert (e.dir / "steps").is_dir() and e.read("steps").num_rows > 0
