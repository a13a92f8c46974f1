"""The catalog's own properties: portable SQL, generated docs, shared views computed once, and
the fast forms of `runs` and the split checks equal to the plain queries they replaced."""

from __future__ import annotations

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios

from checking import (edit, edit_manifest, findings, hits)


def test_catalog_transpiles_to_spark():
    import sqlglot
    from sqlglot.errors import ErrorLevel

    from vllm_contract.replay.query.views import derived_sql

    sources = [(inv.path.name, inv.sql) for inv in catalog.load()]
    sources += [(f"derived view {i} ({split=})", sql) for split in (True, False)
                for i, sql in enumerate(derived_sql(["engine=a-dp0", "engine=o'b-dp1"], split))]
    for name, sql in sources:
        try:
            out = sqlglot.transpile(sql, read="duckdb", write="spark",
                                    unsupported_level=ErrorLevel.RAISE)
        except Exception as e:  # noqa: BLE001 - any failure names its source
            pytest.fail(f"{name}: {e}")
        assert out and out[0].strip()


def test_catalog_docs_are_generated():
    root = Path(__file__).resolve().parents[2]
    assert (root / "docs" / "invariants.md").read_text() == catalog.markdown(catalog.load()), (
        "docs/invariants.md is stale: run `make docs`")


def test_step_never_executed(tiny_model, tmp_path):
    """A live engine's trace records each hand-off to the executor; a step with finished ids
    that was never executed leaks them even though finished_req_ids carried them."""
    scenarios.run("aborts", tiny_model, tmp_path)
    steps = open_trace(tmp_path).read("steps").to_pylist()
    skipped = next(s["step"] for s in steps[:-1] if s["num_finished"] > 0)
    gone = {r["req_id"] for r in open_trace(tmp_path).read("finished").to_pylist()
            if r["step"] == skipped}
    edit(tmp_path, "transport", lambda rows: [
        {"step": s["step"], "event": "executed", "worker": None, "seq": i + 1, "t_ns": 0,
         "num_scheduled_tokens": s["total_num_scheduled_tokens"]}
        for i, s in enumerate(steps) if s["step"] != skipped])
    report = findings(tmp_path)
    assert hits(report, "transport.not_executed") == [(skipped, None)]
    assert gone <= {r for _, r in hits(report, "finished.leaked")}
    # receipts: the worker got every hand-off but one
    edit(tmp_path, "transport", lambda rows: rows + [
        dict(r, event="received", worker=0) for r in rows if r["seq"] != 3])
    lost = next(r["step"] for r in open_trace(tmp_path).read("transport").to_pylist()
                if r["seq"] == 3)
    assert hits(findings(tmp_path), "transport.not_received") == [(lost, None)]




def test_shared_views_are_computed_once_and_shown_in_the_progress(tiny_model, tmp_path):
    """The shared views are computed once, before the first check that reads them, and the
    progress line says so (at a million steps that takes most of a run); `runs` stays a view
    over them; the checks that read them give the same findings as when each is run alone."""
    scenarios.run("preemption", tiny_model, tmp_path)
    edit(tmp_path, "preempted", lambda rows: [])  # findings for checks that read runs
    calls = []
    with Gateway(tmp_path) as gw:
        invs = catalog.load()
        report = checker.run(gw, invs, progress=lambda n, total, name: calls.append((n, name)))
        assert gw.is_materialized("windowed_runs") and gw.is_materialized("run_ids")
        assert not gw.is_materialized("runs")
    shared = [(n, name.split()[-1].rstrip(")")) for n, name in calls
              if "computing the shared view" in name]
    # each view, and the views that read it: computed once, before the first check needing any
    readers_of = {"step_totals": {"step_totals"},
                  "grants": {"grants", "group_grants", "window_releases", "block_holds"},
                  "group_grants": {"group_grants", "window_releases", "block_holds"},
                  "window_releases": {"window_releases", "block_holds"},
                  "block_holds": {"block_holds"},
                  "drafts": {"drafts", "run_groups", "windowed_runs", "run_ids", "runs"},
                  "instances": {"instances", "run_groups", "windowed_runs", "run_ids", "runs"},
                  "run_groups": {"run_groups", "windowed_runs", "run_ids", "runs"},
                  "windowed_runs": {"windowed_runs", "run_ids", "runs"},
                  "run_ids": {"run_ids"}}
    assert sorted(name for _, name in shared) == sorted(readers_of)
    for n, name in shared:
        assert n == min(i for i, inv in enumerate(invs) if readers_of[name] & set(inv.needs))
    reads = set(readers_of) | {"runs"}
    assert calls[-1] == (len(invs), "")
    readers = [inv.id for inv in invs if reads & set(inv.needs)]
    assert "computed.progress" in readers and "blocks.table_short" in readers
    alone = [f for rid in readers for f in findings(tmp_path, [rid]).findings]
    assert any(f.invariant == "lifecycle.resumed_without_preemption" for f in alone)
    assert sorted(map(str, alone)) == sorted(
        str(f) for f in report.findings if f.invariant in readers)


# The `runs` view as a plain window over every listed row (what it was before ids that need no
# window were split off): the reference the split must equal, row for row.
WINDOW_RUNS = """
WITH keyed AS (
    SELECT s.step, s.kind, s.num_scheduled_tokens, s.num_computed_tokens, s.num_output_tokens,
           COALESCE(CARDINALITY(s.spec_token_ids), 0) AS drafts, i.inst, s.engine, s.req_id
    FROM scheduled s
    LEFT JOIN instances i ON i.engine = s.engine AND i.req_id = s.req_id
         AND s.step >= i.intro_step AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
    WHERE s.kind IS NOT NULL
)
SELECT engine, req_id, inst, step, kind, num_scheduled_tokens, num_computed_tokens,
       num_output_tokens, drafts,
       LAG(step) OVER w AS prev_step,
       LAG(num_computed_tokens + num_scheduled_tokens) OVER w AS prev_end,
       LAG(drafts) OVER w AS prev_drafts
FROM keyed
WINDOW w AS (PARTITION BY engine, req_id, inst ORDER BY step)
"""


def runs_rows(path):
    """(reference rows, the view's rows, ids the view took without its window, all ids)."""
    with Gateway(path) as gw:
        want = gw.sql(WINDOW_RUNS).to_pylist()
        got = gw.sql("""
            SELECT k.engine, k.req_id, r.inst, r.step, r.kind, r.num_scheduled_tokens,
                   r.num_computed_tokens, r.num_output_tokens, r.drafts, r.prev_step,
                   r.prev_end, r.prev_drafts
            FROM runs r JOIN run_ids k ON k.inst = r.inst""").to_pylist()
        plain = gw.sql("SELECT COUNT(*) AS n FROM run_groups WHERE plain")["n"][0].as_py()
        ids = gw.sql("SELECT COUNT(*) AS n FROM (SELECT DISTINCT engine, req_id FROM scheduled "
                     "WHERE kind IS NOT NULL)")["n"][0].as_py()
        assert gw.sql("SELECT COUNT(*) AS n FROM run_groups")["n"][0].as_py() == ids
    for r in want:  # orphans: the reference leaves them unkeyed, the view hashes their name
        r.pop("inst")
    for r in got:
        r.pop("inst")
    key = lambda r: tuple((v is None, v) for v in r.values())  # noqa: E731
    return sorted(want, key=key), sorted(got, key=key), plain, ids


@pytest.mark.parametrize("name", ["preemption", "id_reuse", "spec_decode", "chunked_prefill",
                                  "aborts"])
def test_runs_equal_a_plain_window(name, tiny_model, tmp_path):
    """Plain ids (run_groups), whose rows need no window, and the rest (through the window) together
    give what one window over every row gives."""
    scenarios.run(name, tiny_model, tmp_path)
    want, got, plain, ids = runs_rows(tmp_path)
    assert got == want
    assert len(want) > ids > 0
    if name != "spec_decode":  # with drafts every id takes the window
        assert 0 < plain, f"{name}: no id took the short way"


def test_runs_take_the_window_for_ids_broken_mid_run(tiny_model, tmp_path):
    """Three breaks inside one id's run of steps that its first and last rows cannot show: a row
    listed twice in one step, a step skipped, a count off by one. Each id then goes through the
    window (its sums of hashes differ), and runs still equals the reference."""
    scenarios.run("aborts", tiny_model, tmp_path)
    rows = open_trace(tmp_path).read("scheduled").to_pylist()
    by_id = {}
    for r in rows:
        if r["kind"]:
            by_id.setdefault(r["req_id"], []).append(r)
    long_ = sorted((rs for rs in by_id.values() if len(rs) >= 6), key=lambda rs: rs[0]["req_id"])
    assert len(long_) >= 3, "the scenario should have three ids listed in six steps or more"
    dup, gap, off = (rs[3] for rs in long_[:3])

    def breaks(rows):
        out = []
        for r in rows:
            if r is gap or (r["step"], r["req_id"]) == (gap["step"], gap["req_id"]):
                continue
            if (r["step"], r["req_id"]) == (off["step"], off["req_id"]):
                r = {**r, "num_computed_tokens": r["num_computed_tokens"] + 1}
            out.append(r)
            if (r["step"], r["req_id"]) == (dup["step"], dup["req_id"]):
                out.append(dict(r))
        return out

    with Gateway(tmp_path) as gw:
        plain_before = gw.sql("SELECT COUNT(*) AS n FROM run_groups WHERE plain")["n"][0].as_py()
    edit(tmp_path, "scheduled", breaks)
    want, got, plain, _ = runs_rows(tmp_path)
    assert got == want
    assert plain == plain_before - 3
    report = findings(tmp_path)
    assert (dup["step"], dup["req_id"]) in hits(report, "tokens.duplicate_request")
    assert (off["step"], off["req_id"]) in hits(report, "computed.progress")


# Checks that read a plain id's rows only when its run_groups row shows a break, or read
# `grants` and `step_totals` instead of every row: each as the row-by-row query it replaced.
ROW_BY_ROW = {
    "tokens.beyond_request": """
        SELECT k.engine, r.step, k.req_id FROM runs r JOIN run_ids k ON k.inst = r.inst
        WHERE r.inst > 0 AND r.num_scheduled_tokens IS NOT NULL
          AND r.num_computed_tokens + r.num_scheduled_tokens
              > k.prompt_len + COALESCE(r.num_output_tokens, 0) + r.drafts""",
    "finished.and_scheduled": """
        SELECT s.engine, s.step, s.req_id FROM scheduled s
        JOIN finished f ON f.engine = s.engine AND f.step = s.step AND f.req_id = s.req_id
        WHERE s.kind IN ('cached', 'resumed')""",
    "lifecycle.scheduled_after_finish": """
        SELECT s.engine, s.step, s.req_id FROM scheduled s
        JOIN instances i ON i.engine = s.engine AND i.req_id = s.req_id
             AND s.step >= i.intro_step
             AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
        WHERE s.kind IN ('cached', 'resumed') AND i.freed_step < s.step""",
    "tokens.beyond_model_len": """
        SELECT s.engine, s.step, s.req_id FROM scheduled s JOIN engines e ON e.engine = s.engine
        LEFT JOIN instances i ON i.engine = s.engine AND i.req_id = s.req_id
             AND s.step >= i.intro_step
             AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
        LEFT JOIN requests r ON r.engine = i.engine AND r.req_id = i.req_id
             AND r.step = i.intro_step
        WHERE s.num_computed_tokens + s.num_scheduled_tokens > e.max_model_len
              - CASE WHEN r.req_id IS NOT NULL AND r.pooling_params IS NULL THEN 1 ELSE 0 END""",
    "blocks.out_of_range": """
        SELECT DISTINCT engine, step, req_id FROM (
            SELECT engine, step, req_id, UNNEST(b) AS block_id FROM (
                SELECT engine, step, req_id, UNNEST(new_block_ids) AS b FROM scheduled)) i
        WHERE block_id >= (SELECT MIN(num_kv_blocks) FROM engines)""",
    "blocks.table_short": """
        WITH walked AS (
            SELECT inst, step, num_computed_tokens + num_scheduled_tokens AS tokens, blocks,
                   SUM(CASE WHEN kind IN ('new', 'resumed') THEN 1 ELSE 0 END) OVER w AS segment,
                   SUM(blocks) OVER w AS so_far,
                   MAX(CASE WHEN blocks > 0 OR kind IN ('new', 'resumed') THEN step END)
                       OVER w AS changed_at
            FROM runs WINDOW w AS (PARTITION BY inst ORDER BY step ROWS UNBOUNDED PRECEDING)
        ),
        based AS (
            SELECT *, MIN(so_far - blocks) OVER (PARTITION BY inst, segment) AS base
            FROM walked WHERE segment > 0
        )
        SELECT k.engine, MIN(b.step) AS step, k.req_id FROM based b
        JOIN run_ids k ON k.inst = b.inst JOIN engines e ON e.engine = k.engine
        WHERE (b.so_far - b.base) * e.block_size < b.tokens
        GROUP BY k.engine, k.req_id, b.inst, b.changed_at""",
    "outputs.ids_mismatch": """
        WITH updated AS (SELECT DISTINCT engine, step FROM updates),
        s AS (SELECT x.engine, x.step, x.req_id FROM scheduled x
              JOIN updated u ON u.engine = x.engine AND u.step = x.step
              WHERE x.num_scheduled_tokens IS NOT NULL),
        m AS (SELECT x.engine, x.step, x.req_id FROM model_outputs x
              JOIN updated u ON u.engine = x.engine AND u.step = x.step)
        SELECT COALESCE(s.engine, m.engine) AS engine, COALESCE(s.step, m.step) AS step,
               COALESCE(s.req_id, m.req_id) AS req_id
        FROM s FULL OUTER JOIN m ON m.engine = s.engine AND m.step = s.step
             AND m.req_id = s.req_id
        WHERE s.req_id IS NULL OR m.req_id IS NULL""",
    "tokens.total_mismatch": """
        SELECT t.engine, t.step, NULL AS req_id FROM steps t
        LEFT JOIN (SELECT engine, step, SUM(num_scheduled_tokens) AS n FROM scheduled
                   GROUP BY engine, step) s ON s.engine = t.engine AND s.step = t.step
        WHERE t.total_num_scheduled_tokens <> COALESCE(s.n, 0)""",
}


def test_split_checks_equal_their_row_by_row_form(tiny_model, tmp_path):
    """Breaks in plain ids and in ids that take the window alike (a preempted one does):
    each check that spares itself plain ids' rows, or reads the shared `grants` or
    `step_totals`, reports exactly what the row-by-row query reports, and both kinds of id are
    among its findings where it has a split."""
    scenarios.run("mixed", tiny_model, tmp_path)
    with Gateway(tmp_path) as gw:
        plain = {r["req_id"] for r in gw.sql("SELECT req_id FROM run_groups WHERE plain")
                 .to_pylist()}
        blocks = gw.sql("SELECT num_kv_blocks FROM engines")["num_kv_blocks"][0].as_py()
    rows = open_trace(tmp_path).read("scheduled").to_pylist()
    ids = sorted({r["req_id"] for r in rows if r["kind"]})
    windowed = [i for i in ids if i not in plain]
    assert len(plain) >= 4 and windowed, (plain, windowed)
    plain_ids = sorted(plain)
    short = set(plain_ids[:2] + windowed[:1])  # prompts said shorter than they are
    listed = {}
    for r in rows:
        if r["kind"] == "cached":
            listed.setdefault(r["req_id"], []).append(r["step"])
    # finished at one of their own cached steps (and so scheduled after it too)
    freed = [(listed[i][len(listed[i]) // 2], i) for i in plain_ids[2:4] + windowed[:1]
             if len(listed.get(i, ())) >= 3]
    assert len(freed) == 3, "the scenario should list three ids as cached three times or more"

    unfed = {plain_ids[-1], windowed[0]}

    def far_blocks(rows):
        seen = set()
        for r in rows:
            if r["new_block_ids"] and any(r["new_block_ids"]) and r["req_id"] not in seen:
                seen.add(r["req_id"])
                if len(seen) % 3 == 0:
                    r["new_block_ids"] = [[b + blocks for b in g] for g in r["new_block_ids"]]
            elif r["new_block_ids"] and any(r["new_block_ids"]) and r["req_id"] in unfed:
                unfed.discard(r["req_id"])
                r["new_block_ids"] = None  # its table left short from here
        return rows

    edit(tmp_path, "scheduled", far_blocks)
    edit(tmp_path, "requests", lambda rs: [
        {**r, "prompt_len": r["prompt_len"] - 3} if r["req_id"] in short else r for r in rs])
    edit(tmp_path, "finished", lambda rs: rs + [
        {**rs[0], "step": step, "req_id": rid} for step, rid in freed])
    lengths = [r["num_computed_tokens"] + r["num_scheduled_tokens"] for r in rows
               if r["num_scheduled_tokens"]]
    edit_manifest(tmp_path, max_model_len=sorted(lengths)[len(lengths) * 3 // 4])
    edit(tmp_path, "model_outputs", lambda rs: [  # one output lost, one for nobody
        r for r in rs if (r["step"], r["req_id"]) != (rs[5]["step"], rs[5]["req_id"])]
        + [{**rs[-7], "req_id": "ghost"}])
    edit(tmp_path, "steps", lambda rs: [  # totals off by one
        {**r, "total_num_scheduled_tokens": r["total_num_scheduled_tokens"] + 1}
        if r["step"] % 7 == 3 else r for r in rs])
    report = findings(tmp_path, list(ROW_BY_ROW))
    with Gateway(tmp_path) as gw:
        assert plain == {r["req_id"] for r in gw.sql(
            "SELECT req_id FROM run_groups WHERE plain").to_pylist()}, "the breaks keep ids plain"
        for inv, query in ROW_BY_ROW.items():
            want = sorted((r["step"], r["req_id"]) for r in gw.sql(query).to_pylist())
            got = sorted(hits(report, inv))
            assert got == want, inv
            assert want, f"{inv}: the breaks should give it findings"
            if inv in ("tokens.beyond_request", "finished.and_scheduled",
                       "lifecycle.scheduled_after_finish", "blocks.table_short"):
                names = {rid for _, rid in got}
                assert names & plain and names - plain, f"{inv}: plain and windowed ids both"
