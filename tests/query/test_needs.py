"""Each check's `needs:` against what its query reads, checked when the catalog loads: a table
read but not declared fails a trace that lacks it instead of skipping the check; a name declared
but not read skips the check for nothing."""

from __future__ import annotations

import duckdb
import pytest

import tinytrace as tt
from vllm_contract.errors import TraceError
from vllm_contract.replay.query import catalog, checker, deps
from vllm_contract.replay.query.gateway import Gateway

HEADER = """-- id: mine.{name}
-- severity: error
-- title: a user check
-- why: a test
-- relies_on: nothing
-- needs: {needs}
"""


def check(tmp_path, needs, sql, name="check"):
    d = tmp_path / "checks"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.sql").write_text(HEADER.format(name=name, needs=needs) + sql + "\n")
    return d


def load_error(d) -> str:
    with pytest.raises(TraceError) as e:
        catalog.load([d])
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_builtin_needs_cover_what_each_query_reads():
    invs = catalog.load()
    with duckdb.connect() as con:
        for inv in invs:
            read = deps.reads(inv.sql, con)
            assert read <= set(inv.needs) | set(inv.optional), inv.path.name
    leaked = next(i for i in invs if i.id == "finished.leaked")
    assert (leaked.needs, leaked.optional) == (["steps", "finished", "finish_events"],
                                              ["transport"])


def test_builtin_checks_pass_what_a_users_check_is_held_to():
    """load() does not check the built-in checks' `needs:` (only the package changes them): this
    test does, as load() does a user's check."""
    catalog.validate(catalog.load())


def test_validate_finds_what_load_finds(tmp_path):
    d = check(tmp_path, "steps", "SELECT engine, step, NULL AS req_id, 'x' AS details FROM stpes")
    msg = load_error(d)
    with pytest.raises(TraceError) as e:
        catalog.validate([catalog.parse(d / "check.sql")])
    assert str(e.value) == msg and "reads stpes, which no trace has" in msg


def test_a_table_read_but_not_declared_is_named(tmp_path):
    d = check(tmp_path, "steps", "SELECT s.engine, s.step, NULL AS req_id, 'x' AS details\n"
              "FROM steps s JOIN transport t ON t.engine = s.engine AND t.step = s.step")
    msg = load_error(d)
    assert "check.sql" in msg and "`needs:` lacks transport, which its query reads" in msg


def test_a_name_declared_but_not_read_is_named(tmp_path):
    d = check(tmp_path, "steps, transport, engines",
              "SELECT engine, step, NULL AS req_id, 'x' AS details FROM steps")
    msg = load_error(d)
    assert "check.sql" in msg
    assert "`needs:` lists engines, transport, which its query never reads" in msg


def test_an_unknown_name_is_named(tmp_path):
    d = check(tmp_path, "steps, stpes",
              "SELECT engine, step, NULL AS req_id, 'x' AS details FROM steps")
    assert "needs stpes, which no trace has" in load_error(d)
    d = check(tmp_path / "other", "steps",
              "SELECT engine, step, NULL AS req_id, 'x' AS details FROM stpes")
    assert "reads stpes, which no trace has" in load_error(d)


def test_a_query_that_does_not_parse_is_named(tmp_path):
    d = check(tmp_path, "steps", "SELECT engine, FROM WHERE steps")
    msg = load_error(d)
    assert "check.sql" in msg and "does not parse" in msg


def test_ctes_are_not_tables_and_shadow_them_in_their_scope(tmp_path):
    sql = """WITH finished AS (SELECT engine, step FROM steps),
later AS (SELECT f.engine, f.step FROM finished f)
SELECT engine, step, NULL AS req_id, 'x' AS details FROM later
WHERE step IN (SELECT step FROM finish_events)"""
    [inv] = catalog.load([check(tmp_path, "steps, finish_events", sql)], builtin=False)
    assert inv.needs == ["steps", "finish_events"]
    d = check(tmp_path, "steps, finish_events, finished", sql)
    assert "`needs:` lists finished, which its query never reads" in load_error(d)


def test_views_read_through_a_view_may_be_declared(tmp_path):
    """`runs` reads windowed_runs, which the checker stores once per run when a check lists it;
    `scheduled` is read through it too. `runs` itself must be listed."""
    sql = ("SELECT k.engine, r.step, k.req_id, 'x' AS details FROM runs r "
           "JOIN run_ids k ON k.inst = r.inst")
    d = check(tmp_path, "scheduled, runs, windowed_runs, run_ids", sql)
    assert [i.id for i in catalog.load([d], builtin=False)] == ["mine.check"]
    d = check(tmp_path, "scheduled, windowed_runs, run_ids", sql, name="other")
    assert "`needs:` lacks runs, which its query reads" in load_error(d)


def test_a_table_read_if_present_never_skips_the_check(tmp_path):
    """A trace recorded without the transport hooks lacks `transport`: a check that reads it
    only when present runs all the same; one that needs it is skipped."""
    trace = tt.write(tmp_path / "trace", {"steps": tt.steps(3)})
    sql = ("SELECT s.engine, s.step, NULL AS req_id, 'no hand-off' AS details FROM steps s "
           "WHERE s.step NOT IN (SELECT step FROM transport)")
    d = check(tmp_path, "steps, transport (if present)", sql, name="optional")
    check(tmp_path, "steps, transport", sql, name="required")
    invs = catalog.load([d], builtin=False)
    assert [(i.needs, i.optional) for i in invs] == [(["steps"], ["transport"]),
                                                     (["steps", "transport"], [])]
    with Gateway(trace) as gw:
        assert "transport" not in gw.present
        report = checker.run(gw, invs)
    assert report.ran == ["mine.optional"]
    assert list(report.skipped) == ["mine.required"]
    assert [f.step for f in report.findings] == [0, 1, 2]
    assert "reads when present: transport" in catalog.markdown(invs)
