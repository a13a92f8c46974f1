"""Both gateways answer base.QueryGateway, and which derived views a query reads is computed one
way (deps.py, DuckDB's parser) for the catalog's `needs:` check, the views the checker stores and
the views Spark builds. (The Spark gateway on a live session: tests/query/test_spark.py.)"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from vllm_contract.replay.query import deps
from vllm_contract.replay.query.base import QueryGateway
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.replay.query.views import STORED, VIEW_DOCS, derived_views

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "mixed"
# what the checker, the commands and the TUI's check pane call on any gateway
FACE = ("trace", "present", "warnings", "views", "is_materialized", "materialize", "sql",
        "close", "__enter__", "__exit__")


@pytest.mark.parametrize("module, name", [("gateway", "Gateway"), ("spark", "SparkGateway")])
def test_both_gateways_implement_the_interface(module, name):
    from importlib import import_module

    cls = getattr(import_module(f"vllm_contract.replay.query.{module}"), name)
    assert issubclass(cls, QueryGateway)
    assert not inspect.isabstract(cls), cls.__abstractmethods__
    # the shared parts come from the base, not copies
    for attr in ("warnings", "views", "is_materialized", "__enter__", "__exit__"):
        assert attr not in vars(cls), f"{name}.{attr} copies QueryGateway's"
    # a query in DuckDB SQL is what either takes; DuckDB's extras come after it
    assert list(inspect.signature(cls.sql).parameters)[:2] == ["self", "query"]


def test_the_duckdb_gateway_answers_the_face():
    with Gateway(SAMPLE) as gw:
        assert isinstance(gw, QueryGateway)
        for attr in FACE:
            assert hasattr(gw, attr), attr
        assert gw.views == list(VIEW_DOCS) and "scheduled" in gw.present
        assert not gw.is_materialized("runs")
        gw.materialize("instances")
        assert gw.is_materialized("instances")


def test_each_derived_view_reads_only_views_made_before_it():
    order = list(deps.view_reads())
    assert order == list(derived_views(["a", "b"]))
    for i, (name, read) in enumerate(deps.view_reads().items()):
        assert not read & set(order[i:]), name
        assert read <= set(VIEW_DOCS), name


def test_the_views_stored_before_a_check_are_computed_from_what_they_read():
    assert deps.stored_before("scheduled") == ()
    assert deps.stored_before("req_keys") == ()  # read through step_totals, never stored
    assert deps.stored_before("step_totals") == ("step_totals",)
    # `runs` stays a view; what it reads is stored, in creation order
    assert deps.stored_before("runs") == ("instances", "drafts", "run_groups", "windowed_runs")
    assert deps.stored_before("run_ids") == ("instances", "drafts", "run_groups",
                                             "windowed_runs", "run_ids")
    assert set(deps.stored_views()) == STORED
    for view in VIEW_DOCS:
        got = deps.stored_before(view)
        assert set(got) == STORED & deps.through([view]), view


def test_a_name_that_is_not_a_read_is_not_a_dependency():
    """What the Spark gateway builds before a query: a view named in a comment, a string, a
    column or a CTE is not read (a regex over the text took them all for reads)."""
    sql = """-- reads runs? no
WITH instances AS (SELECT engine, step FROM steps)
SELECT i.engine, i.step, 'run_ids' AS details, s.grants FROM instances i
JOIN (SELECT step, 1 AS grants FROM drafts) s ON s.step = i.step"""
    assert deps.reads(sql) == {"steps", "drafts"}
    assert deps.derived_read(deps.reads(sql)) == ["drafts"]
    assert deps.derived_read(["run_groups"]) == ["instances", "drafts", "run_groups"]


def test_no_shipped_module_imports_a_private_name_from_another_module():
    offenders = []
    for d in [ROOT / d for d in ("core", "recorder", "replay", "tui", "cli", "rig")] + [
            ROOT / "tests" / "query"]:
        for path in sorted(d.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (
                        node.level or (node.module or "").startswith("vllm_contract")):
                    offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name}"
                                  for a in node.names
                                  if a.name.startswith("_") and not a.name.startswith("__")]
    assert offenders == []


def test_duckdbs_progress_bar_is_off_on_every_gateway_connection():
    """DuckDB draws its progress bar on fd 1 when a statement runs past two seconds (a view
    stored on a big trace): into the JSON of `check -f json > file`. Our own progress goes to
    stderr."""
    from vllm_contract.replay.query.gateway import Gateway as DuckGateway

    with DuckGateway(ROOT / "samples" / "mixed") as gw:
        for con in (gw.con, gw.cursor()):
            got = con.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0]
            assert got is False
