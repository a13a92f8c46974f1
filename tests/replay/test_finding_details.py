"""Every output that shows a finding without its title shows `Finding.details`, never the
message split back apart at its first ": ": tokens.new_token_ids_length's title holds one
("pipeline parallel: ..."), so a split kept the title's tail and the details together."""

from __future__ import annotations

import asyncio
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

from vllm_contract.findings import Finding, Report
from vllm_contract.replay.export.registry import render

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
TITLE = "pipeline parallel: cached requests' new_token_ids of the wrong length"
DETAILS = "req r1: 2 token(s) sent, 3 scheduled"


def finding(severity: str = "error", title: str = TITLE, engine: str | None = None) -> Finding:
    return Finding("tokens.new_token_ids_length", severity, 7, "r1", DETAILS, engine, title)


def test_the_title_holds_the_separator():
    from vllm_contract.replay.query import catalog

    check = next(i for i in catalog.load() if i.id == "tokens.new_token_ids_length")
    assert ": " in check.title
    assert finding(title=check.title).message == f"{check.title}: {DETAILS}"


def test_check_table_shows_the_details():
    head = SimpleNamespace(severity="error", id="tokens.new_token_ids_length", title=TITLE)
    out = render("check", "table", Report([finding()], {}, [head.id]), [head], "error").stdout
    assert f"        step 7 req r1: {DETAILS}\n" in out
    assert "cached requests'" not in out.replace(TITLE, "")


def replay_run(*findings: Finding):
    """A shadow replay's result holding `findings`, as `replay` hands it to its exporter."""
    from vllm_contract.replay.stepping import ReplayRun

    given = {"worker": "shadow", "title": "the shadow worker", "steps_replayed": 9,
             "findings": list(findings)}
    return ReplayRun(**{f.name: given[f.name] for f in fields(ReplayRun) if f.name in given})


def test_replay_table_shows_the_details():
    out = render("replay", "table", replay_run(finding())).stdout
    assert out.splitlines()[0] == (
        f"ERROR   tokens.new_token_ids_length  step 7 req r1: {DETAILS}")


def test_a_finding_without_a_title_keeps_its_details_whole():
    # its message is its details, which may hold ": " themselves
    out = render("replay", "table", replay_run(finding(title=""))).stdout
    assert out.splitlines()[0].endswith(f"req r1: {DETAILS}")


def test_info_lists_an_integrity_note_by_its_details(monkeypatch):
    from vllm_contract.replay.query import checker, summary
    from vllm_contract.trace import open_trace

    trace = open_trace(SAMPLES / "mixed")
    name = trace.engines[0].name
    found = [finding("info", engine=name), finding("error", engine=name)]
    monkeypatch.setattr(checker, "run", lambda gateway, checks: Report(found, {}, []))
    engine = summary.summary(trace, gateway=object())["engines"][0]
    assert engine["unverified"] == [DETAILS]
    assert engine["integrity"] == [f"tokens.new_token_ids_length: {TITLE}: {DETAILS}"]


def test_the_tui_findings_table_shows_the_details():
    from textual.app import App
    from textual.widgets import DataTable

    from vllm_contract.tui.findings_pane import FindingsPane

    class One(App):
        def compose(self):
            yield FindingsPane()

    async def main():
        app = One()
        async with app.run_test():
            app.query_one(FindingsPane).load([finding()], {})
            row = app.query_one(DataTable).get_row_at(0)
            assert row[-1] == DETAILS

    asyncio.run(main())
