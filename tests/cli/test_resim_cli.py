"""`vllm-contract resim` on the command line: exit 0 identical, 1 diverged, 2 unusable input
with one line on stderr and no traceback; the table and JSON outputs; the input-log note."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.rig import scenarios

import resimkit

@pytest.fixture(scope="module")
def traces(tiny_model, tmp_path_factory):
    """A clean recording, the same scenario recorded with a buggy subclass, and one recorded
    with redacted prompts (prefix caching on, as the scenario has it) as a recorder without
    the input log wrote it (no salted block hashes)."""
    root = tmp_path_factory.mktemp("resim-cli")
    scenarios.run("id_reuse", tiny_model, root / "good")
    scenarios.run("id_reuse", tiny_model, root / "redacted-log", redact_prompts=True)
    resimkit.without_input_log(root / "redacted-log", root / "redacted")
    with resimkit.bug_scheduler(root, "cli_bug_sched") as bug:
        resimkit.record_with(bug, "id_reuse", tiny_model, root / "bug")
        yield root


def _invoke(*args):
    return CliRunner().invoke(app, ["resim", *map(str, args)])


def test_identical_exits_0_with_the_note_first(traces):
    r = _invoke(traces / "good")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[1].endswith("steps identical (100.0 %)") and len(lines) == 2
    assert "note: inputs from the recorded input log" in r.stderr
    r = _invoke(traces / "good", "--format", "json")
    out = json.loads(r.stdout)
    assert r.exit_code == 0 and out["identical"] and out["first_divergence"] is None
    assert out["steps"] == out["identical_steps"] > 0 and out["divergent_steps"] == []


def test_a_divergence_exits_1_and_says_where(traces):
    r = _invoke(traces / "bug")
    assert r.exit_code == 1, (r.stdout, r.stderr)
    first = next(line for line in r.stdout.splitlines() if line.startswith("first divergence"))
    assert "the re-run's finished_req_ids has x; the recording's does not" in first
    r = _invoke(traces / "bug", "--format", "json")
    out = json.loads(r.stdout)
    assert r.exit_code == 1 and out["first_divergence"]["field"] == "finished_req_ids"
    assert out["first_divergence"]["step"] == out["divergent_steps"][0]
    # the buggy class re-runs its own recording step for step, and its re-run (checked in a
    # scratch trace: no --out) has the bug's finding again
    r = _invoke(traces / "bug", "--scheduler-cls", "cli_bug_sched:DropFinishedOnce",
                "--format", "json")
    assert r.exit_code == 1, (r.stdout, r.stderr)
    out = json.loads(r.stdout)
    assert out["identical_steps"] == out["recorded_steps"] > 0
    assert any(f.startswith("finished.leaked") for f in out["whatif"]["rerun"]["findings"])
    assert out["out"]["trace"] is None  # the scratch trace is not kept


def _two_engines(src, dst):
    """A trace root holding `src`'s engine twice, under two names."""
    shutil.copytree(src, dst)
    for table in dst.iterdir():
        for part in list(table.iterdir()):
            if part.name.startswith("engine="):
                shutil.copytree(part, table / (part.name + "-copy"))
    return dst


def _priority(src, dst):
    """A priority-policy trace without an input log: its priorities were never recorded."""
    resimkit.without_input_log(src, dst)
    path = next((dst / "_engines").iterdir()) / "manifest.json"
    m = json.loads(path.read_text())
    m["engine"]["policy"] = "priority"
    path.write_text(json.dumps(m))
    return dst


@pytest.mark.parametrize("case, text", [
    ("class", "scheduler class no_such_mod:Sched is not importable"),
    ("engines", "choose one with --engine"),
    ("redacted", "redacted prompts and prefix caching on"),
    ("priority", "recorded with the priority scheduling policy"),
    ("setting", "unknown setting 'bogus'"),
])
def test_unusable_input_exits_2_with_one_line(traces, tmp_path, case, text):
    args = {"class": [traces / "good", "--scheduler-cls", "no_such_mod:Sched"],
            "engines": [_two_engines(traces / "good", tmp_path / "two")],
            "redacted": [traces / "redacted"],
            "priority": [_priority(traces / "good", tmp_path / "prio")],
            "setting": [traces / "good", "--set", "bogus=1"]}[case]
    r = _invoke(*args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert text in r.stderr and r.stderr.startswith("vllm-contract: error: ")


STOPS: list = []


def stop_hook(stop) -> None:
    """--break-hook's target below: what it was handed."""
    STOPS.append((stop.step, [p.call for p in stop.pending],
                  sorted(stop.recorded["num_scheduled_tokens"])))


def test_break_hook_until_and_out_on_the_command_line(traces, tmp_path):
    STOPS.clear()
    r = _invoke(traces / "good", "--break-at", 1, "--break-hook", f"{__name__}:stop_hook",
                "--until", 3, "--out", tmp_path / "new")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert len(STOPS) == 1 and STOPS[0][0] == 1 and STOPS[0][1][-1] == "schedule"
    assert STOPS[0][2]  # the recording's output for step 1 schedules someone
    lines = r.stdout.splitlines()
    assert lines[1] == "4 of 4 steps identical (100.0 %)"
    assert lines[2].startswith("stopped after step 3 (--until): 4 of the recording's ")
    assert lines[3] == (f"the re-run recorded in {tmp_path / 'new'}: the catalog finds 0 "
                        "error(s), 0 warning(s)")
    # a normal trace: check and sql open it
    assert CliRunner().invoke(app, ["check", str(tmp_path / "new")]).exit_code == 0
    q = CliRunner().invoke(app, ["sql", str(tmp_path / "new"), "select count(*) as n from "
                                 "steps", "--format", "json"])
    assert q.exit_code == 0 and json.loads(q.stdout) == [{"n": 4}], q.stdout


def test_out_in_json_counts_the_recorded_bug_the_stock_class_no_longer_makes(traces,
                                                                            tmp_path):
    r = _invoke(traces / "bug", "--out", tmp_path / "fixed", "--format", "json")
    out = json.loads(r.stdout)
    assert r.exit_code == 1 and out["first_divergence"]["field"] == "finished_req_ids"
    assert out["out"]["errors"] == 0 and out["out"]["warnings"] == 0
    assert out["out"]["trace"] == str(tmp_path / "fixed") and out["until"] is None
    r = CliRunner().invoke(app, ["check", str(traces / "bug")])
    assert r.exit_code == 1 and "finished.leaked" in r.stdout


@pytest.mark.parametrize("case, text", [
    ("break_at", "--break-at 99999: the recording has steps 0 to "),
    ("until", "--until 99999: the recording has steps 0 to "),
    ("hook", "break hook no_such_mod:f is not importable: ModuleNotFoundError"),
    ("hook_alone", "--break-hook needs --break-at STEP"),
    ("out", "already exists and is not an empty directory"),
])
def test_a_bad_stop_or_out_exits_2_with_one_line(traces, case, text):
    args = {"break_at": ["--break-at", 99999], "until": ["--until", 99999],
            "hook": ["--break-at", 0, "--break-hook", "no_such_mod:f"],
            "hook_alone": ["--break-hook", f"{__name__}:stop_hook"],
            "out": ["--out", traces / "good"]}[case]
    r = _invoke(traces / "good", *args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert text in r.stderr and r.stderr.startswith("vllm-contract: error: ")


def test_an_override_is_a_what_if_run_compared_side_by_side(traces):
    """One running request at a time: more steps to drain; no findings on either side (the
    re-run checked in a scratch trace, since there is no --out): exit 0."""
    r = _invoke(traces / "good", "--set", "max_num_seqs=1")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("engine ") and "what-if run with" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.split() == ["recording", "re-run"])
    rows = {line[:30].strip(): line[30:].split() for line in lines[header + 1:header + 9]}
    recorded, rerun = map(int, rows["steps to drain"])
    assert rerun > recorded
    assert rows["catalog errors / warnings"] == ["0", "/", "0", "0", "/", "0"]
    assert "the re-run checked in a scratch trace (--out NEW_TRACE keeps it)" in r.stdout
    assert "what-if run: arrivals at the recording's step index" in r.stderr
    j = json.loads(_invoke(traces / "good", "--set", "max_num_seqs=1", "--format",
                           "json").stdout)
    assert j["whatif"]["recording"]["steps_to_drain"] == recorded
    assert j["whatif"]["rerun"]["steps_to_drain"] == rerun
    assert j["whatif"]["rerun"]["requests"] == j["whatif"]["recording"]["requests"] == 3


def test_a_what_if_run_exits_1_when_the_re_run_has_findings(traces, tmp_path):
    """The buggy class re-run on its own recording finds its bug again: exit 1; the stock
    class with an override leaves none: exit 0. Both sides' findings are in the JSON."""
    r = _invoke(traces / "bug", "--scheduler-cls", "cli_bug_sched:DropFinishedOnce",
                "--out", tmp_path / "again", "--format", "json")
    assert r.exit_code == 1, (r.stdout, r.stderr)
    w = json.loads(r.stdout)["whatif"]
    assert w["rerun"]["errors"] > 0 and w["recording"]["errors"] > 0
    assert any(f.startswith("finished.leaked") for f in w["rerun"]["findings"])
    r = _invoke(traces / "bug", "--set", "max_num_batched_tokens=128", "--out",
                tmp_path / "fixed")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    row = next(line for line in r.stdout.splitlines()
               if line.startswith("catalog errors / warnings"))
    recorded, rerun = row[30:44].strip(), row[44:].strip()  # two columns, 14 wide
    assert rerun == "0 / 0" and recorded != "0 / 0"
