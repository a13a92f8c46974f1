"""`--help` of every command: a flag takes no value, so none is shown after it (typer's rich
help printed `<bool>` there); an option that takes one still shows what it takes."""

from __future__ import annotations

import re

import typer.main
from typer.testing import CliRunner

from vllm_contract.cli import app

runner = CliRunner()
COMMANDS = sorted(typer.main.get_command(app).commands)


def _help(*args: str) -> str:
    r = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    return r.stdout


def test_no_flag_shows_a_value_after_it():
    assert {"check", "info", "replay", "tui", "record"} <= set(COMMANDS)
    for args in [(), *((c,) for c in COMMANDS)]:
        text = _help(*args)
        assert "--help" in text
        assert "<bool>" not in text, (args, [x for x in text.splitlines() if "<bool>" in x])


def test_flags_are_listed_and_value_options_show_their_type():
    text = _help("check")
    [flag] = [x for x in text.splitlines() if "--list " in x]
    assert re.search(r"--list\s+List the checks and exit\.", flag), flag
    assert re.search(r"--fail-on\s+<error\|warning\|info>", text)
    assert re.search(r"--only\s+<list\[str\]>", text)
