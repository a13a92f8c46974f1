"""The catalog on Spark gives the DuckDB run's findings, byte for byte in JSON, on every sample,
clean and broken, and a recorded break, all gathered into one root (Spark's planning and job
overhead are paid per run, not per engine), with every trace the catalog's tests checked before,
and through the CLI. One local[2] SparkSession serves the whole module. pyspark and Java are test requirements: without them these
fail and say what to install, rather than skip."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.trace import open_trace

import fleetkit
from checking import patched

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
TEST_CONF = {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "1g"}


@pytest.fixture(scope="module")
def spark():
    try:
        import pyspark  # noqa: F401
    except ImportError:
        pytest.fail("the Spark tests need pyspark: pip install -e '.[test]' (or '.[spark]')")
    from vllm_contract.replay.query.spark import java_missing, session

    if why := java_missing():
        pytest.fail(f"the Spark tests need Java: {why}")
    s = session("local[2]", TEST_CONF)
    yield s
    s.stop()


def _json(report) -> str:
    return json.dumps([f.to_dict() for f in report.findings], indent=2)


def test_every_sample_and_every_trace_checked_before_gives_the_same_findings_on_spark(
        spark, tiny_model, tmp_path):
    """One root holds every sample, clean and broken, and every trace the catalog's tests
    checked before this one in the session (the break tests' traces: real scheduler runs broken
    after schedule(), and edited recordings), each an engine of its own: one Spark run checks
    them all (tests/fleetkit.py)."""
    from vllm_contract.replay.query.spark import SparkGateway

    samples = {f"sample-{p.name}": p for p in sorted(SAMPLES.iterdir()) if p.is_dir()}
    # a name a file URI escapes (Spark reads that engine's files apart) and SQL must quote
    samples["sample o'mixed"] = samples.pop("sample-mixed")
    kept = fleetkit.kept()
    if not kept:  # a break of its own, as the break tests make them
        def drop_finished(so, step):
            if so.finished_req_ids and step < 60:
                rid = sorted(so.finished_req_ids)[0]
                so.finished_req_ids.discard(rid)
                return step, rid

        patched(tiny_model, tmp_path / "leak", "preemption", drop_finished)
        kept = {"leaked-finished-ids": tmp_path / "leak"}
    root = fleetkit.gather({**samples, **kept}, tmp_path / "fleet")
    invs = catalog.load()
    with Gateway(root) as gw:
        duck = checker.run(gw, invs)
    with SparkGateway(root, spark=spark) as sg:
        on_spark = checker.run(sg, invs)
    assert _json(on_spark) == _json(duck)
    assert on_spark.skipped == duck.skipped and on_spark.ran == duck.ran
    # the gathering changes nothing: each sample's findings in the fleet are its own, alone
    sources = {**samples, **kept}.values()
    assert len(open_trace(root).engines) == sum(len(open_trace(p).engines) for p in sources)
    assert {n for n in kept if any(f.severity == "error" for f in duck.findings
                                   if f.engine == n)}, "no break among the traces gathered"
    for name, path in samples.items():
        with Gateway(path) as gw:
            alone = [f.to_dict() for f in checker.run(gw, invs).findings]
        ours = [dict(f.to_dict(), engine=alone[0]["engine"] if alone else f.engine)
                for f in duck.findings if f.engine == name]
        assert ours == alone, name


def test_a_table_with_an_empty_batch_reaches_spark_whole(spark):
    """PySpark's createDataFrame drops every record batch after one without rows, silently; the
    recorder writes such batches (a flush without a step commits an empty `steps` batch), and
    one engine's did, in the middle of a fleet's `steps`: Spark lost the later engines' steps
    and computed.progress flagged every rejected draft of a trace among them."""
    from vllm_contract.replay.query.spark import arrow_frame

    (e,) = open_trace(SAMPLES / "mixed").engines
    steps = e.read("steps")
    cut = pa.concat_tables([steps.slice(0, 5), steps.slice(5, 0), steps.slice(5)])
    assert [b.num_rows for b in cut.to_batches()][:2] == [5, 0], "no empty batch to hand over"
    df = arrow_frame(spark, cut)
    assert df.count() == steps.num_rows
    assert sorted(r["step"] for r in df.select("step").collect()) == \
        sorted(steps.column("step").to_pylist())
    assert arrow_frame(spark, steps.slice(0, 0)).count() == 0


def test_check_cli_on_spark_prints_the_same_json_and_exit_code(spark):
    """`check --sql-engine spark` uses the session already running in the process and leaves
    it running. Two checks: the whole catalog's findings are the fleet test's."""
    trace = str(SAMPLES / "broken-leak")
    only = ["--only", "finished.leaked", "--only", "lifecycle.abandoned"]
    duck = CliRunner().invoke(app, ["check", trace, "-f", "json", *only])
    on_spark = CliRunner().invoke(app, ["check", trace, "-f", "json", *only, "--sql-engine",
                                        "spark", "--spark-conf", "spark.sql.shuffle.partitions=4"])
    assert (on_spark.exit_code, on_spark.stdout) == (duck.exit_code, duck.stdout)
    assert duck.exit_code == 1 and json.loads(duck.stdout)
    assert spark.sparkContext._jsc is not None  # not stopped by the command


def test_derived_views_are_stored_when_a_query_first_reads_them(spark):
    """A query of the tables stores no derived view, nor does one naming views only in a
    comment or a string; one of run_ids stores it and the views it reads (deps.py), and nothing
    else; the rows are DuckDB's. The Spark gateway is a QueryGateway, as DuckDB's is."""
    from vllm_contract.replay.query import deps
    from vllm_contract.replay.query.base import QueryGateway
    from vllm_contract.replay.query.spark import SparkGateway

    q = "SELECT engine, req_id, intro_step FROM run_ids ORDER BY intro_step, req_id"
    with SparkGateway(SAMPLES / "broken-leak", spark=spark) as sg:
        assert isinstance(sg, QueryGateway)
        assert sg.sql("SELECT COUNT(*) AS n FROM steps").column("n")[0].as_py() > 0
        assert sg.sql("-- runs\nSELECT 'lifeline' AS grants FROM steps LIMIT 1").num_rows == 1
        assert not [v for v in sg.views if sg.is_materialized(v)]
        on_spark = sg.sql(q).to_pylist()
        stored = {v for v in sg.views if sg.is_materialized(v)}
    assert stored == set(deps.derived_read(["run_ids"]))
    assert {"run_ids", "windowed_runs", "run_groups", "instances"} <= stored
    assert not stored & {"lifeline", "grants", "step_totals", "req_keys"}
    with Gateway(SAMPLES / "broken-leak") as gw:
        assert on_spark == gw.sql(q).to_pylist()


def test_parquet_read_by_spark_or_sent_from_the_reader_gives_the_same_rows(spark):
    """The two ways a table reaches Spark (Spark reading the Parquet files itself, or the
    reader's Arrow sent from the driver, as for a remote trace on a cluster) give the same rows
    of every table."""
    from vllm_contract import schema
    from vllm_contract.replay.query.spark import SparkGateway

    rows = {}
    for reads in (True, False):
        with SparkGateway(SAMPLES / "spec-decode", spark=spark, spark_reads=reads) as sg:
            rows[reads] = {t: sorted(map(repr, sg.sql(f"SELECT * FROM {t}").to_pylist()))
                           for t in schema.TABLE_NAMES}
    assert sum(map(len, rows[True].values())) > 0
    assert rows[True] == rows[False]


def test_only_local_masters_read_a_mirrored_remote_trace_in_place():
    from vllm_contract.replay.query.spark import is_local

    assert all(map(is_local, ["local", "local[2]", "local[*]", "local[4,2]"]))
    assert not any(map(is_local, ["spark://h:7077", "yarn", "k8s://https://h",
                                   "local-cluster[2,1,1024]"]))


def test_spark_without_java_is_one_line_exit_2(tmp_path):
    result = CliRunner(env={"PATH": str(tmp_path), "JAVA_HOME": ""}).invoke(
        app, ["check", str(SAMPLES / "mixed"), "--sql-engine", "spark"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "Java" in result.stderr, result.stderr
    assert shutil.which("java"), "the environment's PATH is back after the command"


def test_spark_options_need_the_spark_engine():
    result = CliRunner().invoke(app, ["check", str(SAMPLES / "mixed"), "--spark-conf", "a=b"])
    assert result.exit_code == 2 and "--sql-engine spark" in result.stderr


def test_ids_fingerprints_are_step_totals():
    """outputs.ids_mismatch compares its model output's fingerprints with step_totals': spelled
    out in its SQL, they must be views.fingerprint's."""
    from vllm_contract.replay.query.views import fingerprint

    sql = next(i.sql for i in catalog.load() if i.id == "outputs.ids_mismatch")
    assert fingerprint("m.step", "m.req_id", 0) in sql and fingerprint("m.step", "m.req_id", 1) in sql


def test_json_members_by_a_computed_key_are_spark_brackets():
    """DuckDB's `$."k"` path is NULL on Spark (found by the fleet test on outputs.index_mismatch,
    whose request ids hold dashes): transpiled, it is Spark's `$['k']`."""
    from vllm_contract.replay.query.spark import transpile

    sql = next(i.sql for i in catalog.load() if i.id == "outputs.index_mismatch")
    assert "'$.\"' || t.k" in sql
    out = transpile(sql)
    assert "GET_JSON_OBJECT(m.value_json, '$[''' || t.k || ''']')" in out
    assert '$."' not in out
