"""Traces on object storage: info, check, sql and replay read `s3://bucket/prefix` through
pyarrow.fs, and compact writes back to it, against moto's S3 server started on 127.0.0.1 by
the test (a real HTTP S3 endpoint, not a patched client)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time

import pytest

from readerkit import SAMPLES, assert_clean_failure, invoke
from vllm_contract import remote, schema
from vllm_contract.rig import scenarios
from vllm_contract.trace import open_trace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server in a process of its own: in this one, its Flask would sit in
    sys.modules, where vLLM's start-up walks module attributes and trips on Flask's
    context-bound proxies."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail("moto's S3 server did not start: these tests need "
                        "`pip install 'moto[server]'` (in the test extra)")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.time() < end, "moto's server did not start within 60 s"
            time.sleep(0.2)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    import pyarrow.fs as pafs

    pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http",
                      allow_bucket_creation=True).create_dir("traces")
    yield "s3://traces"
    mp.undo()
    proc.terminate()
    proc.wait(30)


def _json(*args):
    r = invoke(*args)
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_info_check_and_sql_read_a_remote_trace_as_the_local_one(s3):
    local = SAMPLES / "broken-leak"
    url = f"{s3}/samples/broken-leak"
    remote.push(local, url)
    for cmd in (["check", "-f", "json"], ["sql", "-f", "json"]):
        extra = ["SELECT engine, COUNT(*) AS n FROM scheduled GROUP BY ALL"] if cmd[0] == "sql" else []
        assert _json(cmd[0], url, *extra, *cmd[1:]) == _json(cmd[0], local, *extra, *cmd[1:])
    mine, theirs = _json("info", url, "-f", "json"), _json("info", local, "-f", "json")
    for e in mine["engines"] + theirs["engines"]:
        e.pop("path")  # a local copy's, and the sample's
    assert mine["engines"] == theirs["engines"]
    t = open_trace(url)
    assert t.source == url and t.read("steps") == open_trace(local).read("steps")


def test_check_on_spark_reads_a_remote_trace_as_the_local_one(s3):
    """`check s3://… --sql-engine spark`: Spark (local[2]) reads the trace's local mirror."""
    local = SAMPLES / "broken-leak"
    url = f"{s3}/spark/broken-leak"
    remote.push(local, url)
    only = ["--only", "finished.leaked", "--only", "computed.progress"]
    on_spark = _json("check", url, "-f", "json", "--sql-engine", "spark", *only)
    assert on_spark == _json("check", local, "-f", "json", *only)
    assert [f["invariant"] for f in on_spark] == ["finished.leaked"]


def test_compact_writes_parquet_back_to_the_bucket(s3, tiny_model, tmp_path):
    scenarios.run("preemption", tiny_model, tmp_path / "t")
    url = f"{s3}/live/preemption"
    remote.push(tmp_path / "t", url)
    before = _json("check", url, "-f", "json")
    r = invoke("compact", url)
    assert r.exit_code == 0, r.output
    fs, base = remote._filesystem(url)
    keys = [i.path for i in remote._list(fs, base, url)]
    assert any(k.endswith(schema.PARQUET_SUFFIX) for k in keys)
    assert not any(k.endswith(schema.SEGMENT_SUFFIX) for k in keys)
    assert _json("check", url, "-f", "json") == before
    local = tmp_path / "again"
    shutil.copytree(open_trace(url).root, local)
    assert open_trace(local).read("scheduled").num_rows == open_trace(
        tmp_path / "t").read("scheduled").num_rows


def test_a_missing_prefix_or_bucket_is_one_line_and_exit_2(s3):
    assert "no such trace" in assert_clean_failure(invoke("info", f"{s3}/nothing-here"))
    assert_clean_failure(invoke("check", "s3://no-such-bucket/x"))
