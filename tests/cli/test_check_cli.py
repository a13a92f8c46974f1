"""`check`, `sql` and `info` on the command line: formats, exit codes, bad input, the prompt."""

from __future__ import annotations

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from vllm_contract import schema
from vllm_contract.cli import app
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios

from checking import (findings, patched)


def test_cli_formats_and_exit_codes(tiny_model, tmp_path):
    trace = tmp_path / "t"
    scenarios.run("chunked_prefill", tiny_model, trace)
    r = CliRunner().invoke(app, ["check", str(trace), "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == []

    def drop_finished(so, step):
        if so.finished_req_ids:
            so.finished_req_ids.clear()
            return step, None

    broken = tmp_path / "b"
    patched(tiny_model, broken, "chunked_prefill", drop_finished)
    r = CliRunner().invoke(app, ["check", str(broken), "--format", "json"])
    assert r.exit_code == 1
    rows = json.loads(r.stdout)
    assert rows and {"invariant", "severity", "step", "req_id", "message"} <= set(rows[0])
    assert "finished.leaked" in {x["invariant"] for x in rows}
    r = CliRunner().invoke(app, ["check", str(broken), "--format", "jsonl"])
    assert [json.loads(line) for line in r.stdout.splitlines()] == rows
    r = CliRunner().invoke(app, ["check", str(broken), "--format", "csv"])
    assert r.stdout.splitlines()[0] == "invariant,severity,engine,step,req_id,message"
    r = CliRunner().invoke(app, ["check", str(broken), "--format", "junit"])
    import xml.etree.ElementTree as ET

    suite = ET.fromstring(r.stdout)
    assert int(suite.get("failures")) >= 1
    r = CliRunner().invoke(app, ["check", str(broken)])
    assert r.exit_code == 1 and "finished.leaked" in r.stdout
    # --only and --fail-on
    r = CliRunner().invoke(app, ["check", str(broken), "--only", "tokens.nonpositive"])
    assert r.exit_code == 0
    r = CliRunner().invoke(app, ["check", str(trace), "--fail-on", "info",
                                 "--only", "trace.unclean_close"])
    assert r.exit_code == 0


def test_cli_bad_input(tiny_model, tmp_path):
    trace = tmp_path / "t"
    scenarios.run("chunked_prefill", tiny_model, trace)
    runner = CliRunner()

    def fails(args, text):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr + r.stdout
        assert text in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

    fails(["check", str(trace), "--only", "no.such"], "unknown check id")
    bad = tmp_path / "checks"
    bad.mkdir()
    (bad / "x.sql").write_text("-- id: mine.bad\n-- severity: fatal\nSELECT 1\n")
    fails(["check", str(trace), "--invariants", str(bad)], "malformed check")
    (bad / "x.sql").write_text("-- id: mine.bad\n-- severity: error\n-- title: t\n-- why: w\n"
                               "-- relies_on: r\n-- needs: steps\nSELECT nonsense FROM steps\n")
    fails(["check", str(trace), "--invariants", str(bad)], "mine.bad")
    fails(["check", str(tmp_path / "missing")], "no such trace")
    fails(["sql", str(trace), "SELECT * FROM no_such_view"], "SQL error")
    runner.env = {"VLLM_CONTRACT_MEMORY_LIMIT": "lots"}
    fails(["check", str(trace)], "VLLM_CONTRACT_MEMORY_LIMIT")


def test_memory_limit_is_bounded_and_spills_are_cleaned_up(tiny_model, tmp_path, monkeypatch):
    """DuckDB gets a budget (not its default 80 % of the machine) and a private spill
    directory, removed when the gateway closes."""
    trace = tmp_path / "t"
    scenarios.run("chunked_prefill", tiny_model, trace)
    monkeypatch.delenv("VLLM_CONTRACT_MEMORY_LIMIT", raising=False)
    with Gateway(trace) as gw:
        limit = gw.sql("SELECT current_setting('memory_limit') AS m")["m"][0].as_py()
        spill = Path(gw.sql("SELECT current_setting('temp_directory') AS t")["t"][0].as_py())
        assert spill.is_dir()
    assert not spill.exists()
    number, unit = limit.split()
    assert unit in ("MiB", "GiB") and float(number) * (1024 if unit == "GiB" else 1) <= 6 * 1024
    monkeypatch.setenv("VLLM_CONTRACT_MEMORY_LIMIT", "300MB")
    with Gateway(trace) as gw:
        assert gw.sql("SELECT current_setting('memory_limit') AS m")["m"][0].as_py() == "286.1 MiB"


def test_user_check_and_a_trace_lacking_a_table(tiny_model, tmp_path):
    trace = tmp_path / "t"
    scenarios.run("aborts", tiny_model, trace)
    mine = tmp_path / "checks"
    mine.mkdir()
    (mine / "long.sql").write_text(
        "-- id: mine.long_prompt\n-- severity: warning\n-- title: long prompt\n"
        "-- why: ours\n-- relies_on: nothing\n-- needs: requests\n"
        "SELECT engine, step, req_id, 'prompt ' || CAST(prompt_len AS VARCHAR) AS details\n"
        "FROM requests WHERE prompt_len >= 40\n")
    r = CliRunner().invoke(app, ["check", str(trace), "--invariants", str(mine), "--format",
                                 "json", "--only", "mine.long_prompt"])
    assert r.exit_code == 0
    assert {x["req_id"] for x in json.loads(r.stdout)} == {"a0", "a1", "a2", "a3"}
    (e,) = open_trace(trace).engines
    import shutil

    shutil.rmtree(schema.table_dir(e.dir, "finish_events"))
    report = findings(trace)
    assert "finished.leaked" in report.skipped
    assert "finish_events" in report.skipped["finished.leaked"]


def test_sql_command_and_views(tiny_model, tmp_path):
    scenarios.run("preemption", tiny_model, tmp_path)
    r = CliRunner().invoke(app, ["sql", str(tmp_path), "SELECT COUNT(*) AS n FROM preempted",
                                 "--format", "json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)[0]["n"] == open_trace(tmp_path).read("preempted").num_rows
    with Gateway(tmp_path) as gw:
        life = gw.sql("SELECT * FROM lifeline").to_pylist()
        assert {x["req_id"] for x in life} == {f"p{i}" for i in range(6)}
        assert all(x["finish_reason"] == "LENGTH" for x in life)
        assert sum(x["resumes"] for x in life) == gw.sql(
            "SELECT COUNT(*) AS n FROM scheduled WHERE kind = 'resumed'")["n"][0].as_py()
    # engine is an ENUM in the views; to a user's SQL and its output it is the engine's name
    (name,) = [e.name for e in open_trace(tmp_path).engines]
    rows = open_trace(tmp_path).read("scheduled").num_rows
    query = (f"SELECT engine, COUNT(*) AS n, MAX(engine || '/') AS tagged FROM scheduled "
             f"WHERE engine = '{name}' AND engine LIKE '%dp0' AND engine IN "
             f"(SELECT col0 FROM (VALUES ('{name}'))) GROUP BY engine")
    for fmt in ("json", "csv"):
        r = CliRunner().invoke(app, ["sql", str(tmp_path), query, "--format", fmt])
        assert r.exit_code == 0, r.output
        if fmt == "json":
            assert json.loads(r.stdout) == [{"engine": name, "n": rows, "tagged": name + "/"}]
        else:
            assert r.stdout.splitlines() == ["engine,n,tagged", f"{name},{rows},{name}/"]




def test_info_reports_view_counts(tiny_model, tmp_path):
    scenarios.run("preemption", tiny_model, tmp_path)
    r = CliRunner().invoke(app, ["info", str(tmp_path), "--format", "json", "--views"])
    assert r.exit_code == 0
    views = json.loads(r.stdout)["views"]
    t = open_trace(tmp_path)
    for table in schema.TABLE_NAMES:
        assert views[table] == t.read(table).num_rows, table
    assert views["lifeline"] == views["instances"] == 6 and views["engines"] == 1
    # without --views, the tables' counts alone: the derived views are not computed
    r = CliRunner().invoke(app, ["info", str(tmp_path), "--format", "json"])
    plain = json.loads(r.stdout)["views"]
    assert plain == {k: v for k, v in views.items() if k in plain}
    assert set(schema.TABLE_NAMES) <= set(plain) and "lifeline" not in plain


def test_sql_interactive_prompt(tiny_model, tmp_path):
    scenarios.run("aborts", tiny_model, tmp_path)
    session = ("SELECT COUNT(*) AS n\n  FROM finished;\n.views\nSELECT nope;\n"
               "SELECT req_id FROM lifeline WHERE req_id = 'a1';\n")
    r = CliRunner().invoke(app, ["sql", str(tmp_path)], input=session)
    assert r.exit_code == 0, r.stderr
    n = open_trace(tmp_path).read("finished").num_rows
    assert f"\n{n} " in r.stdout or f"\n{n}\n" in r.stdout
    assert "lifeline" in r.stdout  # .views listed them
    assert "SQL error" in r.stderr  # a bad statement does not end the session
    assert "a1" in r.stdout


def test_junit_fails_only_at_or_above_fail_on_and_names_only_what_a_finding_has():
    """samples/mixed has info findings only: JUnit counts them as failures only when --fail-on
    reaches info, as the exit code does; a finding without a step or request says no 'None'."""
    import xml.etree.ElementTree as ET

    sample = Path(__file__).resolve().parents[2] / "samples" / "mixed"
    r = CliRunner().invoke(app, ["check", str(sample), "-f", "json"])
    rows = json.loads(r.stdout)
    assert rows and {x["severity"] for x in rows} == {"info"}, rows
    by = {}
    for x in rows:
        by.setdefault(x["invariant"], []).append(x)
    for fail_on, failing in (("error", set()), ("info", set(by))):
        r = CliRunner().invoke(app, ["check", str(sample), "-f", "junit", "--fail-on", fail_on])
        assert r.exit_code == (1 if failing else 0)
        suite = ET.fromstring(r.stdout)
        assert int(suite.get("failures")) == len(failing)
        cases = {c.get("name"): c for c in suite.iter("testcase")}
        assert {n for n, c in cases.items() if c.find("failure") is not None} == failing
        for inv, found in by.items():
            text = "".join(cases[inv].itertext())
            assert len(text.strip().splitlines()) == len(found)
            assert "None" not in text


def test_sql_json_keeps_sums_numbers():
    """DuckDB's SUM of a BIGINT is a 128-bit integer: JSON gets a number, equal to the sum the
    reader computes, not its text."""
    sample = Path(__file__).resolve().parents[2] / "samples" / "mixed"
    (e,) = open_trace(sample).engines
    want = sum(e.read("steps", ["total_num_scheduled_tokens"]).column(0).to_pylist())
    r = CliRunner().invoke(app, ["sql", str(sample), "SELECT SUM(total_num_scheduled_tokens) AS t,"
                                 " AVG(total_num_scheduled_tokens) AS a FROM steps", "-f", "json"])
    (row,) = json.loads(r.stdout)
    assert row["t"] == want and isinstance(row["t"], int)
    assert isinstance(row["a"], float)
