"""Docs that are generated must match their source; the README's commands must exist."""

from __future__ import annotations

import re
from pathlib import Path

from vllm_contract import schema
from vllm_contract.rig import scenarios

ROOT = Path(__file__).resolve().parents[2]


def test_trace_tables_doc_is_generated_from_the_schema():
    assert (ROOT / "docs" / "trace-tables.md").read_text() == schema.markdown(), (
        "docs/trace-tables.md is stale: run `make docs`")


def test_sql_views_doc_is_generated():
    from vllm_contract.replay.query.views import views_markdown

    assert (ROOT / "docs" / "sql-views.md").read_text() == views_markdown(), (
        "docs/sql-views.md is stale: run `make docs`")


def test_every_scenario_is_documented():
    text = (ROOT / "docs" / "scenarios.md").read_text()
    missing = [name for name in scenarios.SCENARIOS if f"`{name}`" not in text]
    assert not missing, f"docs/scenarios.md lacks {missing}"


def test_readme_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z]+):", makefile, re.M))
    used = set(re.findall(r"`make ([a-z]+)`", (ROOT / "README.md").read_text()))
    assert used and used <= targets, used - targets
