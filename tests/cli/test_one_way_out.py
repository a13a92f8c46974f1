"""What every command shares (vllm_contract.cli.common): a trace it cannot use is one line on
stderr and exit 2 from the one handler in the app's group, whichever command met it; `--format`
offers what the exporters have, with `--json` kept as `--format json`; one progress line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app, common, export, reduce, resim
from vllm_contract.replay.export import formats

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "mixed"
GONE = "/no/such/trace"


@pytest.mark.parametrize("args", [
    ["check", GONE], ["sql", GONE, "select 1"], ["info", GONE], ["compact", GONE],
    ["replay", GONE], ["resim", GONE], ["reduce", GONE, "--finding", "x", "--out", "{tmp}/r"],
    ["export", GONE, "--perfetto", "{tmp}/x.pftrace"], ["report", GONE, "--out", "{tmp}/x.html"],
    ["tui", GONE],
], ids=lambda a: a[0])
def test_a_trace_that_is_not_there_is_one_line_and_exit_2(args, tmp_path):
    r = CliRunner().invoke(app, [a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 2, r.output
    assert r.stderr == f"vllm-contract: error: {GONE}: no such trace directory\n"
    assert r.stdout == ""


def test_the_handler_ends_the_progress_line_before_its_own(monkeypatch, tmp_path):
    from vllm_contract.errors import TraceError

    def broken(trace, out, progress, **kw):
        progress(1, 3)
        progress(2, 3)  # within the plain lines' interval: held back until the line ends
        raise TraceError("a segment broke")

    monkeypatch.setattr("vllm_contract.replay.timeline.perfetto.export", broken)
    r = CliRunner().invoke(app, ["export", str(SAMPLE), "--perfetto", str(tmp_path / "x")])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == ("exporting: 1 of 3 steps\nexporting: 2 of 3 steps\n"
                        "vllm-contract: error: a segment broke\n")


def test_the_script_itself_exits_2_with_no_traceback():
    r = subprocess.run([sys.executable, "-c", "from vllm_contract.cli import main; main()",
                        "check", GONE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"vllm-contract: error: {GONE}: no such trace directory\n"


@pytest.mark.parametrize("choice, kind", [(resim.ResimFormat, "resim"),
                                          (reduce.ReduceFormat, "reduce"),
                                          (export.ExportFormat, "export"),
                                          (export.ReportFormat, "report")])
def test_the_printing_commands_offer_their_kinds_formats(choice, kind):
    assert [c.value for c in choice] == formats(kind) == ["table", "json"]


@pytest.mark.parametrize("command, out", [("export", "--perfetto"), ("report", "--out")])
def test_json_is_format_json_and_left_out_of_help(command, out, tmp_path):
    def run(*extra):
        r = CliRunner().invoke(app, [command, str(SAMPLE), out, str(tmp_path / "f"), *extra])
        assert r.exit_code == 0, r.output
        return r

    old, new = run("--json"), run("--format", "json")
    assert old.stdout == new.stdout and old.stderr == new.stderr
    assert json.loads(new.stdout)["bytes"] > 0
    table = run()
    assert table.stdout == "" and table.stderr.splitlines()[-1].startswith(
        f"wrote {tmp_path / 'f'}: 1 engine(s)")
    help_ = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "120"}).stdout
    assert "--format" in help_ and "--json" not in help_


def test_reduce_json_is_format_json(monkeypatch, tmp_path):
    result = SimpleNamespace(stopped="--max-seconds", as_dict=lambda: {"calls": 1})
    monkeypatch.setattr("vllm_contract.replay.resim.reduce.reduce",
                        lambda *a, **k: result)
    outs = [CliRunner().invoke(app, ["reduce", str(SAMPLE), "--finding", "x", "--out",
                                     str(tmp_path / "r"), *flag]) for flag in
            (["--json"], ["-f", "json"])]
    assert outs[0].stdout == outs[1].stdout == '{\n  "calls": 1\n}\n'
    assert outs[0].stderr == outs[1].stderr == (
        "vllm-contract: note: stopped early (--max-seconds): the best reduction so far\n")


def test_the_progress_line(capsys):
    line = common.Progress(fmt="re-running {bar} {n}/{total}")
    line.tty = True  # as on a terminal: one line redrawn
    line(3, 4)
    line(5, 4)  # past the total: the bar stays full
    line.end()
    assert capsys.readouterr().err == (
        f"\rre-running [{'#' * 22}{'.' * 8}] 3/4\rre-running [{'#' * 30}] 5/4\n")
    quiet = common.Progress(fmt="checking {n}/{total} {name}", tty_only=True)
    assert not quiet.tty  # pytest's capture: as into a file, where it shows nothing
    quiet(1, 2, "x")
    quiet.end()
    assert capsys.readouterr().err == ""
