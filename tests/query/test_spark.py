"""The catalog on Spark gives the DuckDB run's findings, byte for byte in JSON, on samples clean
and broken. Spark's planning and job overhead make a sample cost most of a minute on this box,
so the suite checks three (a clean one here, two broken ones here and through the CLI) and
`make spark` checks every sample (VLLM_CONTRACT_SPARK_ALL=1). One local[2] SparkSession serves
the whole module. pyspark and Java are test requirements: without them these fail and say what
to install, rather than skip."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
NAMES = (sorted(p.name for p in SAMPLES.iterdir() if p.is_dir())
         if os.environ.get("VLLM_CONTRACT_SPARK_ALL") else ["mixed", "broken-unknown-cached"])
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


@pytest.mark.parametrize("name", NAMES)
def test_sample_findings_are_the_same_on_spark(spark, name):
    from vllm_contract.replay.query.spark import SparkGateway

    invs = catalog.load()
    with Gateway(SAMPLES / name) as gw:
        duck = checker.run(gw, invs)
    with SparkGateway(SAMPLES / name, spark=spark) as sg:
        on_spark = checker.run(sg, invs)
    assert _json(on_spark) == _json(duck)
    assert on_spark.skipped == duck.skipped and on_spark.ran == duck.ran


def test_check_cli_on_spark_prints_the_same_json_and_exit_code(spark):
    """`check --sql-engine spark` uses the session already running in the process and leaves
    it running."""
    trace = str(SAMPLES / "broken-leak")
    duck = CliRunner().invoke(app, ["check", trace, "-f", "json"])
    on_spark = CliRunner().invoke(app, ["check", trace, "-f", "json", "--sql-engine", "spark",
                                        "--spark-conf", "spark.sql.shuffle.partitions=4"])
    assert (on_spark.exit_code, on_spark.stdout) == (duck.exit_code, duck.stdout)
    assert duck.exit_code == 1 and json.loads(duck.stdout)
    assert spark.sparkContext._jsc is not None  # not stopped by the command


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
    assert fingerprint("m.step", "k.k", 0) in sql and fingerprint("m.step", "k.k", 1) in sql
