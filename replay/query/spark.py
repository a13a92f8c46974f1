"""The invariant catalog on Spark: a gateway with the DuckDB gateway's face (base.QueryGateway:
views, present, materialize, sql returning Arrow), so that `checker.run` runs the same catalog over it and builds
the same findings, severities and titles from the catalog's headers.

The trace is read through the project's own reader (torn tails, checksums and warnings handled as
for DuckDB) and handed to Spark as Arrow; every view and check is the catalog's DuckDB SQL,
transpiled by sqlglot at run time. The SQL keeps to the rules of docs/portable-sql.md, so that
both engines give the same rows. pyspark is an optional extra, imported here alone and lazily.
"""

from __future__ import annotations

import os
import re
import shutil
from functools import lru_cache
from pathlib import Path

import duckdb
import pyarrow as pa

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.trace import Trace, reading
from vllm_contract.replay.query.base import QueryGateway, verified_parquet
from vllm_contract.replay.query.deps import derived_read, reads
from vllm_contract.replay.query.views import derived_views, group_count, manifest_tables

INSTALL = "pip install 'vllm-contract[spark]'"

# Settings for a small local run; --spark-conf overrides any of them.
DEFAULT_CONF = {
    # Spark 4's default, stated: overflow and bad casts fail as in DuckDB instead of wrapping or
    # giving NULL, and CARDINALITY(NULL) is NULL (with ANSI off it is -1)
    "spark.sql.ansi.enabled": "true",
    # and whatever ANSI mode a user sets: the catalog never counts a NULL list as -1
    "spark.sql.legacy.sizeOfNull": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    # DuckDB's session zone is the machine's; timestamps are compared as numbers in the catalog,
    # but a fixed zone keeps any text of them the same on every machine
    "spark.sql.session.timeZone": "UTC",
}

_QUOTED_MEMBER = re.compile(r"""GET_JSON_OBJECT\(([^,()]+), '\$\."' \|\| (.+?) \|\| '"'\)""")
_LIST_REVERSE = re.compile(r"\bLIST_REVERSE\(")
SPARK_MEMBER = r"GET_JSON_OBJECT(\1, '$[''' || \2 || ''']')"
# engine names a file's URI spells as they are (input_file_name() escapes others)
_PLAIN = re.compile(r"[A-Za-z0-9._-]+")


def java_missing() -> str | None:
    """Why Spark cannot start a JVM here, or None."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return None
    if shutil.which("java"):
        return None
    return ("the Spark engine needs Java 17 or later: install a JDK and put `java` on PATH "
            "(or set JAVA_HOME)")


def _pyspark():
    try:
        import pyspark  # noqa: F401
        from pyspark.sql import SparkSession
    except ImportError:
        raise TraceError(f"the Spark engine needs pyspark: {INSTALL}") from None
    return SparkSession


def session(master: str = "local[2]", conf: dict[str, str] | None = None):
    """A SparkSession with DEFAULT_CONF, then `conf`, applied. TraceError (one line) when
    pyspark or Java is missing or the JVM does not start."""
    SparkSession = _pyspark()
    if why := java_missing():
        raise TraceError(why)
    builder = SparkSession.builder.master(master).appName("vllm-contract")
    for k, v in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(k, v)
    try:
        spark = builder.getOrCreate()
    except Exception as e:  # noqa: BLE001 - the JVM's failures have many types
        raise TraceError(f"cannot start Spark ({master}): {_one_line(e)}") from None
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@lru_cache(maxsize=512)
def transpile(sql: str) -> str:
    """DuckDB SQL (the catalog's dialect) as Spark SQL."""
    import sqlglot
    from sqlglot.errors import ErrorLevel

    try:
        out = sqlglot.transpile(sql, read="duckdb", write="spark",
                                unsupported_level=ErrorLevel.RAISE)[0]
    except sqlglot.errors.SqlglotError as e:
        raise TraceError(f"cannot transpile to Spark SQL: {_one_line(e)}") from None
    # A JSON member by a computed key, DuckDB's `'$."' || k || '"'`, is NULL on Spark, whose
    # paths quote a member as $['k'] (docs/portable-sql.md); sqlglot keeps the path as written
    # DuckDB's LIST_REVERSE is Spark's REVERSE, which sqlglot leaves as it is
    return _QUOTED_MEMBER.sub(SPARK_MEMBER, _LIST_REVERSE.sub("REVERSE(", out))


class SparkGateway(QueryGateway):
    """One trace's tables and derived views as temporary views of a SparkSession. `spark`: a session to use (and leave open);
    without one, a session is started from `master` and `conf` and stopped at close().
    `spark_reads`: whether Spark reads the Parquet segments itself (True) or they travel from
    this process through the reader (False); by default Spark reads them unless the trace is a
    remote one's local mirror and the master is not local (its executors cannot see it)."""

    def __init__(self, trace: Trace | str | Path, spark=None, master: str = "local[2]",
                 conf: dict[str, str] | None = None, spark_reads: bool | None = None) -> None:
        self._open(trace)
        if spark is None:
            # a session already running in this process is used, and left running
            self._own = _pyspark().getActiveSession() is None
            spark = session(master, conf)
        else:
            self._own = False
        self.spark = spark
        self._derived: dict[str, str] = {}  # name -> SQL of the derived views, in order
        self._frames: list = []  # stored frames, released at close()
        # A remote trace is mirrored in a private folder of this process, which a cluster's
        # executors cannot see: its files travel from here, as live segments do.
        # `spark_reads` True or False says whether Spark reads the Parquet files itself.
        self._ship = (bool(self.trace.source) and not is_local(spark.sparkContext.master)
                      if spark_reads is None else not spark_reads)
        try:
            with reading(self.trace.root):
                self._verified = verified_parquet(self.trace)
                for table in schema.TABLE_NAMES:
                    if any(e.segments(table) for e in self.trace.engines):
                        self.present.add(table)
                    self._table(table)
            for view, table in manifest_tables(self.trace).items():
                self._register(view, table)
            # Every derived view is stored when it is made: over the nested plans of plain
            # views Spark's planner ran out of heap (computed.progress, on 1.2k rows). They are
            # made when a query first reads them (`_ensure`), so a run of a few checks pays for
            # the views those read alone.
            self._derived = derived_views([e.name for e in self.trace.engines], split=False,
                                          groups=group_count(self.trace))
        except TraceError:
            self.close()
            raise
        except Exception as e:  # noqa: BLE001 - Spark's errors come from py4j and pyspark
            self.close()
            raise TraceError(f"{self.trace.root}: cannot create views on Spark: "
                             f"{_one_line(e)}") from None
        except BaseException:
            self.close()
            raise

    def _table(self, table: str) -> None:
        """A trace table as a view: Parquet segments read by Spark itself, in one read of all
        engines' files (a read per engine made every query's plan a union as wide as the
        fleet), each row's engine taken from its file's `engine=NAME` folder; live segments,
        and a Parquet one that fails verification, through the project's reader (as the DuckDB
        gateway does)."""
        from pyspark.sql import functions as F

        verified = self._verified
        sch = schema.schema(table)
        spark_schema = self.spark.createDataFrame(sch.empty_table()).schema
        cols = ["engine", *sch.names]
        frames, rest, files = [], [], []
        for e in self.trace.engines:
            segs = e.segments(table)
            parquet = [] if self._ship else [p for p in segs if verified.get(p)]
            if parquet and not _PLAIN.fullmatch(e.name):
                # a name a file URI would escape: read apart, its name a constant
                df = self.spark.read.schema(spark_schema).parquet(*map(str, parquet))
                frames.append(df.withColumn("engine", F.lit(e.name)).select(*cols))
            else:
                files += parquet
            live = [t for p in segs if p not in parquet
                    and (t := e.segment(p)) is not None and t.num_rows]
            if live:
                t = pa.concat_tables(live)
                rest.append(t.add_column(0, "engine", pa.array([e.name] * t.num_rows,
                                                                 pa.string())))
        if files:
            df = self.spark.read.schema(spark_schema).parquet(*map(str, files))
            # the last engine=NAME folder of the path: TRACE/<table>/engine=NAME/ (format 2)
            # or TRACE/engine=NAME/<table>/ (format 1)
            engine = F.regexp_extract(F.input_file_name(), r".*/engine=([^/]+)/", 1)
            frames.append(df.withColumn("engine", engine).select(*cols))
        if rest or not frames:
            t = pa.concat_tables(rest) if rest else pa.schema(
                [pa.field("engine", pa.string()), *sch]).empty_table()
            frames.append(arrow_frame(self.spark, t).select(*cols))
        df = frames[0]
        for other in frames[1:]:
            df = df.unionByName(other)
        df.createOrReplaceTempView(table)

    def _register(self, name: str, table: pa.Table) -> None:
        # the trace's own Arrow types: Spark infers them from the Arrow schema, rows or none
        arrow_frame(self.spark, table).createOrReplaceTempView(name)

    def _store(self, name: str, df) -> None:
        # localCheckpoint cuts the plan, so a view reading this one plans over a scan of it
        stored = df.localCheckpoint(eager=True)
        self._frames.append(stored)
        stored.createOrReplaceTempView(name)

    def materialize(self, view: str) -> None:
        """Store `view` (a derived view) and the derived views it reads, if not yet stored."""
        self._ensure([view])

    def _ensure(self, names) -> None:
        """Store the derived views among `names`, and those they read, in creation order (each
        reads only views before it)."""
        for name in derived_read(names):
            if name not in self._materialized:
                try:
                    self._store(name, self.spark.sql(transpile(self._derived[name])))
                except TraceError:
                    raise
                except Exception as e:  # noqa: BLE001 - Spark's errors come from py4j
                    raise TraceError(f"cannot create the view {name} on Spark: "
                                     f"{_one_line(e)}") from None
                self._materialized.add(name)

    def sql(self, query: str) -> pa.Table:
        """`query` (DuckDB SQL, transpiled) run on Spark, as Arrow."""
        spark_sql = transpile(query)
        try:
            read = reads(query)  # the views it reads, by the parser of the SQL's dialect
        except (ValueError, duckdb.Error) as e:
            raise TraceError(f"SQL error (Spark): {_one_line(e)}") from None
        self._ensure(read)
        try:
            return self.spark.sql(spark_sql).toArrow()
        except Exception as e:  # noqa: BLE001 - Spark's errors come from py4j and pyspark
            raise TraceError(f"SQL error (Spark): {_one_line(e)}") from None

    def close(self) -> None:
        for df in self._frames:
            try:
                df.unpersist()
            except Exception:  # noqa: BLE001,S110 - a stopped session has nothing to release
                pass
        self._frames = []
        if self._own and self.spark is not None:
            self.spark.stop()
            self.spark = None


def is_local(master: str) -> bool:
    """Whether a Spark master URL runs everything in this machine's one JVM (local, local[N],
    local[*], local[N,F]), whose executors see this process's files."""
    return master == "local" or master.startswith("local[")


def arrow_frame(spark, table: pa.Table):
    """`table` as a Spark DataFrame, every row of it. PySpark's createDataFrame stops at the
    first record batch without rows and drops every batch after it, silently; the recorder
    writes such batches (a flush with no step commits an empty `steps` batch), and the tables
    of many engines are handed over as one. Empty batches are left out first."""
    batches = [b for b in table.to_batches() if b.num_rows]
    whole = pa.Table.from_batches(batches, schema=table.schema) if batches \
        else table.schema.empty_table()
    return spark.createDataFrame(whole)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    # a JVM error carries its whole stack trace: its first line says what went wrong
    return text.split(" at org.apache.")[0].split("JVM stacktrace:")[0].strip()[:500]
