"""The query gateway: one DuckDB connection over one trace, with documented views.

Compacted segments are read by DuckDB itself (read_parquet, lazily, so a trace larger than memory
still scans); live `.arrows` stream segments, which DuckDB cannot read, go through our reader
(keeping every whole batch of a torn tail) and are registered as Arrow tables without copying.
Every result is a pyarrow.Table; every DuckDB error becomes a TraceError.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

import duckdb
import pyarrow as pa

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.trace import Trace, reading
from vllm_contract.replay.query.base import QueryGateway, verified_parquet
from vllm_contract.replay.query.deps import stored_views
from vllm_contract.replay.query.views import derived_views, group_count, manifest_tables, quote


def _no_progress_bar(con: duckdb.DuckDBPyConnection) -> None:
    """DuckDB draws its progress bar on fd 1 once a statement runs past two seconds (a view
    stored on a big trace): into a command's JSON or CSV. Progress is ours to show, on stderr."""
    con.execute("SET enable_progress_bar = false")


class Gateway(QueryGateway):
    """Owns the DuckDB connection for one trace (a root or one engine directory)."""

    def __init__(self, trace: Trace | str | Path, memory_limit: str | None = None,
                 derived: bool = True) -> None:
        """`derived` False: the trace's tables and the manifest's views only (what `info`
        reads), without binding the derived views' chain."""
        self._open(trace)
        self.derived = derived
        self._spill = tempfile.mkdtemp(prefix="vllm-contract-duckdb-")
        # Removed at close(), or when the gateway is collected or the interpreter exits.
        self._remove_spill = weakref.finalize(self, shutil.rmtree, self._spill, True)
        limit = memory_limit or default_memory_limit()
        try:
            # A bounded budget, spilling to disk beyond it: a million-step trace must not take
            # the whole machine (DuckDB's default is 80 % of it).
            self.con = duckdb.connect(":memory:", config={"memory_limit": limit,
                                                          "temp_directory": self._spill})
            _no_progress_bar(self.con)
        except duckdb.Error as e:
            self._remove_spill()
            raise TraceError(f"memory limit {limit!r} (VLLM_CONTRACT_MEMORY_LIMIT): "
                             f"{_one_line(e)}") from None
        self._lock = threading.Lock()
        self._arrow: dict[str, pa.Table] = {}
        try:
            with reading(self.trace.root):
                self._create_views()
        except duckdb.Error as e:
            self.close()
            raise TraceError(f"{self.trace.root}: cannot create views: {_one_line(e)}") from None
        except BaseException:
            self.close()
            raise

    def _create_views(self) -> None:
        # Every GROUP BY, window and join of the catalog is keyed by engine: as a VARCHAR that
        # compared strings on every row, as an ENUM it costs what an integer does.
        names = ", ".join(f"'{quote(n)}'"
                          for n in dict.fromkeys(e.name for e in self.trace.engines))
        self.con.execute(f"CREATE TYPE engine_name AS ENUM ({names})")
        verified = verified_parquet(self.trace)
        for table in schema.TABLE_NAMES:
            sch = schema.schema(table)
            selects = []
            cols = ", ".join(f'"{f.name}"' for f in sch)
            for i, e in enumerate(self.trace.engines):
                # Each engine's rows are a branch of their own with the engine a constant: a
                # filter on one engine then reads that engine's files alone (views.per_engine).
                engine = f"CAST('{quote(e.name)}' AS engine_name) AS engine"
                segs = e.segments(table)
                if segs:
                    self.present.add(table)
                # DuckDB checks neither page checksums nor columns' types: verified here, and a
                # damaged file is read (and noted) as a live segment is instead
                parquet = [str(p) for p in segs if verified.get(p)]
                if parquet:
                    files = ", ".join("'" + p.replace("'", "''") + "'" for p in parquet)
                    selects.append(f"SELECT {engine}, {cols} FROM read_parquet([{files}])")
                live = []
                by_duckdb = set(parquet)
                for p in segs:
                    if str(p) not in by_duckdb:
                        t = e.segment(p)
                        if t is not None and t.num_rows:
                            live.append(t)
                # An engine without live rows gets no live branch: an empty one costs the view
                # the files' statistics (DuckDB then groups steps by a general hash table, which
                # is slower).
                if live:
                    name = self._hold(f"_live_{table}_{i}", pa.concat_tables(live))
                    selects.append(f"SELECT {engine}, {cols} FROM {name}")
            if not selects:  # no engine has this table: an empty view of the right columns
                name = self._hold(f"_live_{table}", schema.empty(sch))
                selects.append(f"SELECT CAST(NULL AS engine_name) AS engine, {cols} FROM {name}")
            self.con.execute(f"CREATE VIEW {table} AS " + " UNION ALL ".join(selects))
        for view, table in manifest_tables(self.trace).items():
            self._hold(f"_{view}", table)
            self.con.execute(f"CREATE VIEW {view} AS SELECT * REPLACE "
                             f"(CAST(engine AS engine_name) AS engine) FROM _{view}")
        if self.derived:
            for view, select in derived_views([e.name for e in self.trace.engines],
                                             groups=group_count(self.trace)).items():
                self.con.execute(f"CREATE VIEW {view} AS {select}")

    def _hold(self, name: str, table: pa.Table) -> str:
        """Register an Arrow table under `name`, kept alive as long as the connection."""
        self._arrow[name] = table
        self.con.register(name, table)
        return name

    def materialize(self, view: str) -> None:
        """Compute a derived view once and keep the result: several checks read `runs`, and
        recomputing its window (`windowed_runs`) per check cost more than all the checks
        themselves."""
        if view in self._materialized:
            return
        try:
            # the rows' order means nothing here, and keeping it made `runs` slower to store
            self.con.execute("SET preserve_insertion_order = false")
            try:
                # in the database, not TEMP: the checks' cursors read it too
                self.con.execute(f"CREATE TABLE _mat_{view} AS SELECT * FROM {view}")
            finally:
                self.con.execute("RESET preserve_insertion_order")
            self.con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM _mat_{view}")
        except duckdb.Error as e:
            raise TraceError(f"cannot materialise {view}: {_one_line(e)}") from None
        self._materialized.add(view)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection for another thread (DuckDB: one cursor per thread), seeing the same
        views. A cursor is a connection of its own: the Arrow tables registered on the main one
        (live segments, `engines`, `dropped`, `integrity`) are registered on it too, without a
        copy. Views materialised (`materialize`) are tables of the database, which every
        cursor sees."""
        cur = self.con.cursor()
        try:
            _no_progress_bar(cur)
            for name, table in self._arrow.items():
                cur.register(name, table)
        except duckdb.Error as e:
            cur.close()
            raise TraceError(f"cannot open a cursor: {_one_line(e)}") from None
        return cur

    def sql(self, query: str, con: duckdb.DuckDBPyConnection | None = None,
            params: list | dict | None = None) -> pa.Table:
        """`query`'s result; `params` fills its `?`/`$1` (a list) or `$name` (a dict)
        placeholders, so that a value from a person needs no quoting."""
        try:
            return (con or self.con).sql(query, params=params).to_arrow_table()
        except duckdb.Error as e:
            raise TraceError(f"SQL error: {_one_line(e)}") from None

    def interrupt(self) -> None:
        self.con.interrupt()

    def counts(self, derived: bool = False) -> dict[str, int]:
        """Rows of each view: the trace's tables and the manifest's (engines, dropped,
        integrity); with `derived`, also the views computed from them, which cost what a
        check of the whole trace costs."""
        base = {*schema.TABLE_NAMES, "engines", "dropped", "integrity"}
        if derived and not self.derived:
            raise TraceError("the derived views were not created (Gateway(derived=False))")
        views = [v for v in self.views if derived or v in base]
        if derived:
            # the shared derived views stored first: counted as views, `runs` alone recomputed
            # run_groups and its window (bench/RESULTS.md)
            for view in stored_views():
                self.materialize(view)
        return {v: self.sql(f"SELECT COUNT(*) AS n FROM {v}")["n"][0].as_py() for v in views}

    def close(self) -> None:
        self.con.close()
        self._remove_spill()


def default_memory_limit() -> str:
    """VLLM_CONTRACT_MEMORY_LIMIT (a DuckDB size such as '6GB'), else 40 % of this machine's
    memory, at most 6 GB."""
    env = os.environ.get("VLLM_CONTRACT_MEMORY_LIMIT")
    if env:
        return env
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "6GB"
    return f"{max(256, min(6 * 1024, int(total * 0.4) >> 20))}MB"


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
