"""bench/check_speed.py measures the catalog against "the time DuckDB needs merely to scan the
columns the checks read". That list is written down there (SCAN_COLUMNS); this holds it to what
DuckDB's own plans of every catalog check read, so that a check reading a new column cannot
leave the baseline too small, nor a column no check reads any more leave it too large."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from vllm_contract import schema
from vllm_contract.replay.query import catalog
from vllm_contract.replay.query.gateway import Gateway

ROOT = Path(__file__).resolve().parents[2]


def _scanned(node: dict, out: dict) -> None:
    info = node.get("extra_info", {})
    table = str(info.get("Table", ""))
    if ".probe_" in table:
        cols = info.get("Projections", [])
        out[table.split(".probe_", 1)[1]].update([cols] if isinstance(cols, str) else cols)
    for child in node.get("children", []):
        _scanned(child, out)


def test_scan_reads_the_columns_the_catalog_reads():
    sys.path.insert(0, str(ROOT / "bench"))
    from check_speed import SCAN_COLUMNS

    read: dict[str, set] = defaultdict(set)
    with Gateway(ROOT / "samples" / "mixed") as gw:
        # Native copies of the tables: their scans name the table in the plan. Without
        # statistics and filter pushdown every column a check names shows under its scan,
        # whatever this one trace happens to hold.
        for t in schema.TABLE_NAMES:
            gw.con.execute(f"CREATE TABLE probe_{t} AS SELECT * FROM {t}")
            gw.con.execute(f"CREATE OR REPLACE VIEW {t} AS SELECT * FROM probe_{t}")
        gw.con.execute("SET disabled_optimizers = 'statistics_propagation,filter_pushdown'")
        for inv in catalog.load():
            plan = gw.con.execute("EXPLAIN (FORMAT JSON) " + inv.sql).fetchall()[0][1]
            for node in json.loads(plan):
                _scanned(node, read)
    read = {t: cols - {"engine"} for t, cols in read.items()}  # the partition, not a column read
    assert read == {t: set(cols) for t, cols in SCAN_COLUMNS.items()}


def test_the_scan_query_runs_on_a_recorded_trace():
    """The baseline once named a reserved word unquoted and failed before measuring anything."""
    sys.path.insert(0, str(ROOT / "bench"))
    from check_speed import SCAN_COLUMNS, scan_sql

    with Gateway(ROOT / "samples" / "mixed") as gw:
        rows = [gw.con.execute(q).fetchone() for q in scan_sql().split(";")]
    assert len(rows) == len(SCAN_COLUMNS)
    assert rows[0][0] > 0  # scheduled rows, counted
