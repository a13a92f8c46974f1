"""The views a trace's tables are read through, beside the tables themselves: their SQL (each
view reads only the ones before it, and all are held to the catalog's portability rules: the
tests transpile them to Spark SQL), which of them the checker stores once per run, and their
documentation, from which docs/sql-views.md is generated. The gateway creates them."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

from vllm_contract import schema
from vllm_contract.kv_groups import group_kind, release_rule

# Views derived from the tables, documented with them (see VIEW_DOCS and docs/sql-views.md).
ENGINES_SCHEMA = pa.schema([
    pa.field("engine", pa.string()), pa.field("model", pa.string()),
    pa.field("block_size", pa.int64()), pa.field("num_kv_blocks", pa.int64()),
    pa.field("max_num_batched_tokens", pa.int64()), pa.field("max_num_seqs", pa.int64()),
    pa.field("max_model_len", pa.int64()), pa.field("closed_cleanly", pa.bool_()),
    pa.field("attached_mid_stream", pa.bool_()), pa.field("recorder_errors", pa.int64()),
    pa.field("vllm_version", pa.string()), pa.field("steps_recorded", pa.int64()),
    pa.field("pruned_steps", pa.int64()), pa.field("stopped_after_step", pa.int64()),
    pa.field("stopped_error", pa.string()), pa.field("recording", pa.bool_()),
    pa.field("async_scheduling", pa.bool_()), pa.field("spec_method", pa.string()),
    pa.field("num_speculative_tokens", pa.int64()),
    pa.field("pipeline_parallel_size", pa.int64()),
])


def engine_row(e) -> dict:
    """An engine's row of `engines`, from its manifest (an EngineTrace), for either gateway."""
    m, s = e.manifest, e.manifest.get("engine") or {}
    spec, par = s.get("speculative") or {}, s.get("parallel") or {}
    # with several KV cache groups, the smallest group's block size: the table length the
    # checks read (blocks_expr) is that group's
    sizes = [g.get("block_size") for g in s.get("kv_cache_groups") or [] if g.get("block_size")]
    return {"engine": e.name, "model": s.get("model"),
            "block_size": min(sizes) if sizes else s.get("block_size"),
            "num_kv_blocks": s.get("num_kv_blocks"),
            "max_num_batched_tokens": s.get("max_num_batched_tokens"),
            "max_num_seqs": s.get("max_num_seqs"), "max_model_len": s.get("max_model_len"),
            "closed_cleanly": bool(m.get("closed_cleanly")),
            "attached_mid_stream": bool(m.get("attached_mid_stream")),
            "recorder_errors": len(m.get("recorder_errors") or []),
            "vllm_version": m.get("vllm_version"),
            "steps_recorded": m.get("steps_recorded"), "pruned_steps": pruned_steps(m),
            "stopped_after_step": (m.get("stopped") or {}).get("after_step"),
            "stopped_error": (m.get("stopped") or {}).get("error"),
            # its recorder still writes it (a lock it holds; core/liveness.py)
            "recording": e.recording is True,
            # batches overlap, and the worker fills in what the scheduler sends as placeholders;
            # a recording made by vLLM's AsyncScheduler class counts even where the config flag
            # was not set (step_with_batch_queue drives it without async_scheduling)
            "async_scheduling": bool(s.get("async_scheduling"))
            or str(s.get("scheduler_class") or "").endswith("AsyncScheduler"),
            "spec_method": spec.get("method"),
            "num_speculative_tokens": spec.get("num_speculative_tokens"),
            "pipeline_parallel_size": par.get("pipeline_parallel_size")}


def problem_row(e, problem: str, kind: str = "checksum") -> dict:
    """A reader's "PATH: what" as a row of `integrity`, naming the segment within its engine;
    `kind`: 'checksum' (data that fails its checksum) or 'lost' (rows gone since written);
    rows of kind 'unverified' (what the engine's segments give no means to check) name none."""
    path, _, details = problem.partition(": ")
    try:
        path = str(Path(path).relative_to(e.dir))
    except ValueError:
        pass
    return {"engine": e.name, "segment": path, "details": details, "kind": kind}


def pruned_steps(manifest: dict) -> int:
    """Steps of the segments deleted at the size cap (max_trace_bytes)."""
    return sum(seg["steps"][1] - seg["steps"][0] + 1
               for seg in manifest.get("pruned_segments", []) if seg.get("steps"))


KV_GROUPS_SCHEMA = pa.schema([
    pa.field("engine", pa.string()), pa.field("grp", pa.int64()), pa.field("kind", pa.string()),
    pa.field("spec", pa.string()), pa.field("block_size", pa.int64()),
    pa.field("release_offset", pa.int64()), pa.field("release_chunk", pa.int64()),
])


def kv_group_rows(e) -> list[dict]:
    """An engine's rows of `kv_groups`, from its manifest's recorded groups (none where the
    manifest has none: an older recorder, or a layout it could not read)."""
    rows = []
    for i, g in enumerate((e.manifest.get("engine") or {}).get("kv_cache_groups") or []):
        rule = release_rule(g)
        rows.append({"engine": e.name, "grp": i, "kind": g.get("kind") or group_kind(g.get("spec")),
                     "spec": g.get("spec"), "block_size": g.get("block_size"),
                     "release_offset": None if rule is None else rule.offset,
                     "release_chunk": None if rule is None else rule.chunk})
    return rows


def group_count(trace) -> int:
    """The most KV cache groups any engine of the trace recorded (1 where none did)."""
    return max([len((e.manifest.get("engine") or {}).get("kv_cache_groups") or [])
                for e in trace.engines] + [1])


INTEGRITY_SCHEMA = pa.schema([pa.field("engine", pa.string()), pa.field("segment", pa.string()),
                              pa.field("details", pa.string()), pa.field("kind", pa.string())])
DROPPED_SCHEMA = pa.schema([pa.field("engine", pa.string()), pa.field("first_step", pa.int64()),
                            pa.field("last_step", pa.int64())])


def manifest_tables(trace) -> dict[str, pa.Table]:
    """The views made from the engines' manifests and the reader's findings (engines, dropped,
    integrity) as Arrow tables, for either gateway."""
    engines = trace.engines
    return {
        "engines": schema.from_rows([engine_row(e) for e in engines], ENGINES_SCHEMA),
        "kv_groups": schema.from_rows([r for e in engines for r in kv_group_rows(e)],
                                      KV_GROUPS_SCHEMA),
        "dropped": schema.from_rows([{"engine": e.name, "first_step": a, "last_step": b}
                                     for e in engines
                                     for a, b in e.manifest.get("dropped_steps", [])],
                                    DROPPED_SCHEMA),
        "integrity": schema.from_rows([problem_row(e, p) for e in engines for p in e.problems]
                                      + [problem_row(e, p, "lost") for e, p in trace.lost_rows()]
                                      + [{"engine": e.name, "segment": None, "details": note,
                                          "kind": "unverified"}
                                         for e in engines for note in e.unverified()],
                                      INTEGRITY_SCHEMA),
    }


# A request instance: an id from its introduction to the next introduction of the same id.
# freed_step: the first step whose finished_req_ids carries it (a delivery in the very step of
# the next introduction belongs to this instance: the worker frees before it adds).
INSTANCES_SQL = """
CREATE VIEW instances AS
WITH intro AS (
    SELECT engine, req_id, step AS intro_step, prompt_len,
           LEAD(step) OVER (PARTITION BY engine, req_id ORDER BY step) AS next_intro_step,
           ROW_NUMBER() OVER (ORDER BY engine, step, req_id) AS inst
    FROM requests
)
SELECT i.inst, i.engine, i.req_id, i.intro_step, i.next_intro_step, i.prompt_len,
       MIN(f.step) AS freed_step
FROM intro i
LEFT JOIN finished f ON f.engine = i.engine AND f.req_id = i.req_id AND f.step > i.intro_step
     AND (i.next_intro_step IS NULL OR f.step <= i.next_intro_step)
GROUP BY i.inst, i.engine, i.req_id, i.intro_step, i.next_intro_step, i.prompt_len
"""

LIFELINE_SQL = """
CREATE VIEW lifeline AS
WITH sched AS (
    SELECT i.engine, i.req_id, i.intro_step, s.step, s.kind, s.num_scheduled_tokens
    FROM instances i JOIN scheduled s ON s.engine = i.engine AND s.req_id = i.req_id
    WHERE s.step >= i.intro_step AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
      AND s.kind IS NOT NULL
),
ev AS (
    SELECT i.engine, i.req_id, i.intro_step, MIN(e.step) AS finish_event_step,
           MIN(e.reason) AS finish_reason
    FROM instances i JOIN finish_events e ON e.engine = i.engine AND e.req_id = i.req_id
    WHERE e.step >= i.intro_step AND (i.next_intro_step IS NULL OR e.step < i.next_intro_step)
    GROUP BY i.engine, i.req_id, i.intro_step
),
agg AS (
    SELECT engine, req_id, intro_step, MIN(step) AS first_step, MAX(step) AS last_step,
           COUNT(*) AS steps_scheduled, CAST(SUM(num_scheduled_tokens) AS BIGINT) AS tokens_scheduled,
           CAST(SUM(CASE WHEN kind = 'resumed' THEN 1 ELSE 0 END) AS BIGINT) AS resumes
    FROM sched GROUP BY engine, req_id, intro_step
)
SELECT i.engine, i.req_id, i.intro_step, a.first_step, a.last_step, a.steps_scheduled,
       a.tokens_scheduled, a.resumes, ev.finish_event_step, ev.finish_reason,
       i.freed_step AS finished_step
FROM instances i
LEFT JOIN agg a ON a.engine = i.engine AND a.req_id = i.req_id AND a.intro_step = i.intro_step
LEFT JOIN ev ON ev.engine = i.engine AND ev.req_id = i.req_id AND ev.intro_step = i.intro_step
"""

# Fingerprints of a pair of values (a step and a count or a request id), summed over a set of
# pairs: two sets with equal sums of both fingerprints are the same set, barring a collision of
# two independent 31-bit fingerprints. Each is the engine's own HASH of the pair, the one of
# (a, b) and the other of (b, a), reduced modulo a prime P below 2^31 (docs/portable-sql.md):
# DuckDB's HASH is 64-bit unsigned and Spark's 32-bit signed, so the values differ between the
# engines, but a fingerprint is only ever compared with one the same engine computed, and
# reduced it is below P in magnitude on both (a remainder keeps its dividend's sign in Spark),
# so a sum over 2^32 rows fits a BIGINT. Hashing the id itself needs no numbering of the ids:
# a join of every row with the numbers was much of what the fingerprints cost.
FINGERPRINTS = (2147483579, 2147483549)


def fingerprint(a: str, b: str, which: int) -> str:
    """SQL for fingerprint `which` (0 or 1) of the pair (a, b). Both sides of a comparison must
    give the pair the same types (a hash reads a value's bytes: Spark's INT and BIGINT 1 differ)."""
    p = FINGERPRINTS[which]
    pair = f"{a}, {b}" if which == 0 else f"{b}, {a}"
    return f"CAST(HASH({pair}) % {p} AS BIGINT)"


# Every listed request id, and whether its rows need the window to find each row's previous
# one. They do not (plain) when the id is one request instance (or one orphan), listed in every
# step from its first to its last, cached after its first row, with no drafts and no count
# missing, and each row's num_computed_tokens is the previous row's computed plus scheduled
# tokens. Then the previous row of a row is the one of the step before, and its end is this
# row's num_computed_tokens. That last condition is checked for all rows of an id at once by
# comparing sums of fingerprints: of (step, computed) over every row but the first, and of
# (step + 1, computed + scheduled) over every row but the last. They are equal exactly when the
# two sets of pairs are (a duplicate or a missing step breaks it too), unless the fingerprints
# collide. In a trace of decoding requests nearly every id is plain; sorting all rows by request,
# as the window does, was much of what `runs` cost.
# run_groups' pass over every listed row, one engine at a time (see per_engine)
RUN_GROUPS_PASS = """
    SELECT {{pick}} AS engine, req_id, MIN(step) AS first_step, MAX(step) AS last_step,
           COUNT(*) AS n,
           COUNT(num_computed_tokens) AS n_computed, COUNT(num_scheduled_tokens) AS n_scheduled,
           SUM(CASE WHEN kind = 'cached' THEN 0 ELSE 1 END) AS uncached,
           ARG_MIN(kind, step) AS first_kind,
           ARG_MIN(num_computed_tokens, step) AS first_computed,
           ARG_MAX(num_computed_tokens + num_scheduled_tokens, step) AS last_end,
           MAX(num_computed_tokens + num_scheduled_tokens - COALESCE(num_output_tokens, 0))
               AS most_ahead,
           SUM({fp_start_0} - {fp_end_0}) AS drift_0, SUM({fp_start_1} - {fp_end_1}) AS drift_1
    FROM scheduled
    WHERE {{only}} AND kind IS NOT NULL
    GROUP BY {{by}}req_id""".format(
    fp_start_0=fingerprint("step", "num_computed_tokens", 0),
    fp_start_1=fingerprint("step", "num_computed_tokens", 1),
    fp_end_0=fingerprint("step + 1", "num_computed_tokens + num_scheduled_tokens", 0),
    fp_end_1=fingerprint("step + 1", "num_computed_tokens + num_scheduled_tokens", 1))

RUN_GROUPS_SQL = f"""
CREATE VIEW run_groups AS
WITH g0 AS (
{{groups}}
),
g AS (
    -- ids listed with no introduction before them (an engine attached mid-stream, or a bug):
    -- keyed by a negative number of their own, counted over the ids (one row each), not rows
    SELECT g0.*, -CAST(ROW_NUMBER() OVER (ORDER BY engine, req_id) AS BIGINT) AS orphan
    FROM g0
),
drafted AS (
    -- ids with drafts (from `drafts`: counting them here read every row's list)
    SELECT DISTINCT engine, req_id FROM drafts WHERE kind IS NOT NULL
),
candidates AS (
    -- with the instances their steps overlap: one that began at or before the first row, or none
    SELECT g.engine, g.req_id, g.first_step, COUNT(i.inst) AS n_inst, MIN(i.inst) AS inst,
           MIN(i.intro_step) AS intro_step
    FROM g
    LEFT JOIN drafted d ON d.engine = g.engine AND d.req_id = g.req_id
    LEFT JOIN instances i ON i.engine = g.engine AND i.req_id = g.req_id
         AND i.intro_step <= g.last_step
         AND (i.next_intro_step IS NULL OR i.next_intro_step > g.first_step)
    WHERE g.n = g.last_step - g.first_step + 1 AND g.n_computed = g.n AND g.n_scheduled = g.n
      AND d.req_id IS NULL AND g.uncached = CASE WHEN g.first_kind = 'cached' THEN 0 ELSE 1 END
      AND g.drift_0 = {fingerprint("g.first_step", "g.first_computed", 0)}
                      - {fingerprint("g.last_step + 1", "g.last_end", 0)}
      AND g.drift_1 = {fingerprint("g.first_step", "g.first_computed", 1)}
                      - {fingerprint("g.last_step + 1", "g.last_end", 1)}
    GROUP BY g.engine, g.req_id, g.first_step
)
SELECT g.engine, g.req_id, g.first_step, g.last_step, g.first_kind, g.last_end, g.most_ahead,
       c.req_id IS NOT NULL AS plain,
       -- an id that is not plain: the key of its rows that no introduction precedes
       CASE WHEN c.req_id IS NOT NULL THEN COALESCE(c.inst, g.orphan) ELSE g.orphan END AS inst
FROM g
LEFT JOIN candidates c ON c.engine = g.engine AND c.req_id = g.req_id
     AND (c.n_inst = 0 OR (c.n_inst = 1 AND c.intro_step <= c.first_step))
"""

# The columns of a listed row that `runs` carries: counts as INTEGER, and no more columns than
# the checks read (every byte of a row travels through the window's sort).
# Blocks a row adds to a request's block table (new_block_ids holds one list per KV cache group):
# the most any group's list adds. The groups whose table covers every token (attention; a Mamba
# group in "align" mode, nulls included) add the same count at the same block size; a Mamba
# group without prefix caching keeps one block per request, and the group with the smallest
# block size (`engines.block_size`) adds the most. Written for up to `groups` groups, the list
# indexed by literals (each engine's dialect numbers lists its own way), each guarded by the
# list's length. `__BLOCKS_S__` and `__BLOCKS__` stand for it in the SQL below.
def blocks_expr(ids: str, groups: int = 1) -> str:
    if groups <= 1:
        each = f"CARDINALITY(FLATTEN({ids})) // CARDINALITY({ids})"
    else:
        each = "GREATEST(" + ", ".join(
            f"CASE WHEN CARDINALITY({ids}) > {k} THEN CARDINALITY({ids}[{k + 1}]) ELSE 0 END"
            for k in range(groups)) + ")"
    return f"""CAST(CASE WHEN {ids} IS NOT NULL AND CARDINALITY({ids}) > 0
                 THEN {each}
                 ELSE 0 END AS INTEGER)"""


_RUN_COLUMNS = """s.step, s.kind, CAST(s.num_scheduled_tokens AS INTEGER) AS num_scheduled_tokens,
           CAST(s.num_computed_tokens AS INTEGER) AS num_computed_tokens,
           CAST(s.num_output_tokens AS INTEGER) AS num_output_tokens,
           {drafts} AS drafts, __BLOCKS_S__ AS blocks"""

# The rows of `runs` of the ids that are not plain: one window pass over them alone. The checker
# materialises it once per run (see Gateway.materialize).
WINDOWED_RUNS_SQL = f"""
CREATE VIEW windowed_runs AS
WITH keyed AS (
    -- the rows of ids that are not plain, each with its request instance (`instances`' inst)
    SELECT {_RUN_COLUMNS.format(
        drafts="CAST(CASE WHEN s.spec_token_ids IS NULL THEN 0 "
               "ELSE CARDINALITY(s.spec_token_ids) END AS INTEGER)")},
           COALESCE(i.inst, g.inst) AS inst
    FROM scheduled s
    JOIN run_groups g ON g.engine = s.engine AND g.req_id = s.req_id AND NOT g.plain
    LEFT JOIN instances i ON i.engine = s.engine AND i.req_id = s.req_id
         AND s.step >= i.intro_step AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
    WHERE s.kind IS NOT NULL
)
SELECT inst, step, kind, num_scheduled_tokens, num_computed_tokens, num_output_tokens, drafts,
       blocks,
       LAG(step) OVER (PARTITION BY inst ORDER BY step) AS prev_step,
       LAG(num_computed_tokens + num_scheduled_tokens) OVER (PARTITION BY inst ORDER BY step)
           AS prev_end,
       LAG(drafts) OVER (PARTITION BY inst ORDER BY step) AS prev_drafts
FROM keyed
"""

# Each listed request row with the end of the previous row of the same request instance: the
# state most checks would otherwise rebuild with a self-join of `scheduled` each. Plain ids
# (`run_groups`) get it from their own row; the others come from `windowed_runs`. The plain part
# stays a view: each check reads only its own columns of it, and storing all of them took longer
# than the checks reading them.
RUNS_SQL = f"""
CREATE VIEW runs AS
SELECT g.inst, {_RUN_COLUMNS.format(drafts="CAST(0 AS INTEGER)")},
       CASE WHEN s.step > g.first_step THEN s.step - 1 END AS prev_step,
       CASE WHEN s.step > g.first_step THEN CAST(s.num_computed_tokens AS INTEGER) END AS prev_end,
       CASE WHEN s.step > g.first_step THEN CAST(0 AS INTEGER) END AS prev_drafts
FROM scheduled s
JOIN run_groups g ON g.engine = s.engine AND g.req_id = s.req_id AND g.plain
WHERE s.kind IS NOT NULL
UNION ALL
SELECT inst, step, kind, num_scheduled_tokens, num_computed_tokens, num_output_tokens, drafts,
       blocks, prev_step, prev_end, prev_drafts
FROM windowed_runs
"""

# Each step's listed requests (rows with a token count) summed up: read by the checks that compare
# a step's rows with the step (its total, the budget, the model output's ids, max_model_len). One
# pass over the rows instead of one per check. One engine at a time (see per_engine).
# Each id listed with tokens or in the model output, numbered (no check reads it: the
# fingerprints hash the ids themselves; kept for queries that want a number per id). One engine
# at a time.
REQ_KEYS_PASS = """
SELECT {pick} AS engine, req_id
FROM (SELECT engine, req_id FROM scheduled
      WHERE {only} AND num_scheduled_tokens IS NOT NULL AND req_id IS NOT NULL
      UNION ALL
      SELECT engine, req_id FROM model_outputs WHERE {only} AND req_id IS NOT NULL) ids
GROUP BY {by}req_id"""

REQ_KEYS_SQL = """
CREATE VIEW req_keys AS
-- numbered within each engine: an engine's views are the same alone as beside others
SELECT engine, req_id,
       CAST(ROW_NUMBER() OVER (PARTITION BY engine ORDER BY req_id) AS BIGINT) AS k
FROM ({ids}) ids
"""

STEP_TOTALS_PASS = """
SELECT {{pick}} AS engine, s.step, COUNT(*) AS n,
       SUM(s.num_scheduled_tokens) AS tokens, SUM({fp_id_0}) AS ids_fp_0,
       SUM({fp_id_1}) AS ids_fp_1,
       MAX(s.num_computed_tokens + s.num_scheduled_tokens) AS most_tokens
FROM scheduled s
WHERE {{only}} AND s.num_scheduled_tokens IS NOT NULL
GROUP BY {{by}}s.step""".format(fp_id_0=fingerprint("s.step", "s.req_id", 0),
                         fp_id_1=fingerprint("s.step", "s.req_id", 1))

# The rows that hand out blocks or reset a block table (about one row in fourteen of a decoding
# trace), with their block ids in one list: the three block checks read these instead of each
# decoding every row's list of lists.
GRANTS_SQL = f"""
CREATE VIEW grants AS
SELECT engine, step, req_id, kind, pos, num_computed_tokens, num_scheduled_tokens,
       __BLOCKS__ AS blocks, FLATTEN(new_block_ids) AS block_ids,
       new_block_ids AS group_ids
FROM scheduled
WHERE new_block_ids IS NOT NULL OR kind IN ('new', 'resumed')
"""

# Each grant row's blocks per KV cache group, placed in the group's table: `start` is the table
# position of the row's first block (a new or resumed row's blocks are the whole table, a cached
# row's are appended after the blocks since the last reset). One branch per group index (a list
# is indexed by a literal, which each engine's dialect numbers its own way); rows without blocks
# that reset a table are kept, with NULL ids.
GROUP_GRANTS_SQL = """
CREATE VIEW group_grants AS
WITH per_group AS (
    {branches}
),
segmented AS (
    SELECT engine, req_id, step, kind, grp, num_computed_tokens, num_scheduled_tokens, ids,
           CASE WHEN ids IS NULL THEN 0 ELSE CARDINALITY(ids) END AS n,
           SUM(CASE WHEN kind IN ('new', 'resumed') THEN 1 ELSE 0 END) OVER (
               PARTITION BY engine, req_id, grp ORDER BY step
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS segment
    FROM per_group
)
SELECT engine, req_id, step, kind, grp, num_computed_tokens, num_scheduled_tokens, ids,
       COALESCE(SUM(n) OVER (PARTITION BY engine, req_id, grp, segment ORDER BY step
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS start
FROM segmented
"""

_GROUP_BRANCH = """SELECT engine, req_id, step, kind, {k} AS grp, num_computed_tokens,
           num_scheduled_tokens, group_ids[{i}] AS ids
    FROM grants
    WHERE kind IS NOT NULL AND group_ids IS NOT NULL AND CARDINALITY(group_ids) > {k}
    UNION ALL
    SELECT engine, req_id, step, kind, {k} AS grp, num_computed_tokens, num_scheduled_tokens,
           CAST(NULL AS INTEGER[]) AS ids
    FROM grants
    WHERE kind IN ('new', 'resumed') AND group_ids IS NULL"""


def group_grants_sql(groups: int = 1) -> str:
    """GROUP_GRANTS_SQL for traces of up to `groups` KV cache groups."""
    branches = "\n    UNION ALL\n    ".join(_GROUP_BRANCH.format(i=k + 1, k=k)
                                            for k in range(max(1, groups)))
    return GROUP_GRANTS_SQL.format(branches=branches)


# Groups whose blocks are freed while their request runs (sliding window, chunked local
# attention, Mamba: `kv_groups` rows with a release rule): for each block such a group was
# handed, the step its request's window left it behind, when vLLM's remove_skipped_blocks
# freed it for others (core/kv_groups.py): the step after the row whose tokens moved the window
# past its position (see `events`). Empty where no engine has such groups.
WINDOW_RELEASES_SQL = """
CREATE VIEW window_releases AS
WITH rules AS (
    -- groups with the same rule free the same positions: each distinct rule is walked once
    SELECT engine, block_size, release_offset, release_chunk,
           CAST(DENSE_RANK() OVER (PARTITION BY engine
                                   ORDER BY block_size, release_offset, release_chunk)
                AS BIGINT) AS rule
    FROM (SELECT DISTINCT engine, block_size, release_offset, release_chunk
          FROM kv_groups WHERE release_chunk IS NOT NULL AND block_size > 0) d
),
wgroups AS (
    SELECT g.engine, g.grp, r.rule
    FROM kv_groups g
    JOIN rules r ON r.engine = g.engine AND r.block_size = g.block_size
         AND r.release_offset = g.release_offset AND r.release_chunk = g.release_chunk
),
ends AS (
    -- every listed row of an engine with such groups: the leading positions its window had
    -- freed at the row's computed tokens, and will have freed once its tokens are computed
    SELECT s.engine, s.req_id, s.step, r.rule,
           (GREATEST(s.num_computed_tokens - r.release_offset, 0) // r.release_chunk
            * r.release_chunk) // r.block_size AS lo,
           (GREATEST(s.num_computed_tokens + s.num_scheduled_tokens - r.release_offset, 0)
            // r.release_chunk * r.release_chunk) // r.block_size AS hi
    FROM scheduled s
    JOIN rules r ON r.engine = s.engine
    WHERE s.kind IS NOT NULL AND s.num_scheduled_tokens > 0
),
events AS (
    -- the positions a row's tokens move the window past are freed in the request's next
    -- allocation, in a later step: the next step is taken (a row-by-row walk to find the
    -- request's true next row cost most of the check), which is never after vLLM frees them
    -- and may be before (the request not scheduled at once, async's in-flight tokens, drafts
    -- rejected): a release taken early can hide a bug, never report a false one
    SELECT engine, req_id, rule, step + 1 AS step, UNNEST(range(lo, hi)) AS tpos
    FROM ends
    WHERE hi > lo
),
blocks_ AS (
    SELECT engine, req_id, step, grp, rule, block_id,
           start + ARRAY_POSITION(ids, block_id) - 1 AS tpos
    FROM (SELECT g.engine, g.req_id, g.step, g.grp, w.rule, g.ids, g.start,
                 UNNEST(g.ids) AS block_id
          FROM group_grants g
          JOIN wgroups w ON w.engine = g.engine AND w.grp = g.grp
          WHERE g.ids IS NOT NULL) u
    WHERE block_id <> 0
)
SELECT b.engine, b.req_id, b.step, b.grp, b.block_id, b.tpos, MIN(e.step) AS release_step
FROM blocks_ b
JOIN events e ON e.engine = b.engine AND e.req_id = b.req_id AND e.rule = b.rule
     AND e.tpos = b.tpos AND e.step > b.step
GROUP BY b.engine, b.req_id, b.step, b.grp, b.block_id, b.tpos
"""


# Each block a request was handed (the null block left out), and the step from which it no
# longer holds it (NULL: to the trace's end): its preemption (its blocks may go to others in
# that very step), the step after its finish event, or, in a sliding-window, chunked-local or
# Mamba group, the step its window left the block behind (`window_releases`). Read by
# blocks.double_owner and blocks.zeroed_held.
BLOCK_HOLDS_SQL = """
CREATE VIEW block_holds AS
WITH acq AS (
    -- each block handed out, with no more columns than finding the blocks that ever had two
    -- holders needs (the others are fetched for those blocks alone)
    SELECT engine, step, req_id, block_id
    FROM (SELECT engine, step, req_id, UNNEST(block_ids) AS block_id
          FROM grants
          WHERE kind IS NOT NULL) u
    WHERE block_id <> 0
),
release_ AS (
    SELECT engine, req_id, step AS end_step FROM preempted
    UNION ALL
    SELECT engine, req_id, step + 1 AS end_step FROM finish_events
    UNION ALL
    -- with batches in flight, a step scheduled before the update that finished its request
    -- grants blocks the free in that update releases too: from the step after that grant on
    -- (a grant of the same id after a new introduction is the next request's)
    SELECT g.engine, g.req_id, g.step + 1 AS end_step
    FROM (SELECT DISTINCT engine, req_id, step FROM grants
          WHERE kind IS NOT NULL AND kind <> 'new') g
    JOIN finish_events e ON e.engine = g.engine AND e.req_id = g.req_id
         AND g.step > e.step AND g.step <= e.step + 16
    LEFT JOIN requests r ON r.engine = g.engine AND r.req_id = g.req_id
         AND r.step > e.step AND r.step <= g.step
    WHERE r.req_id IS NULL
),
spans AS (
    SELECT engine, req_id, MIN(step) AS first_step, MAX(step) AS last_step
    FROM grants
    WHERE kind IS NOT NULL
    GROUP BY engine, req_id
),
id_ends AS (
    -- an id released nowhere between its first and last acquisitions holds every block it got
    -- until its first release after the first: one end per id (cheaper than joining each
    -- acquisition with the releases and taking the least)
    SELECT p.engine, p.req_id, MIN(r.end_step) AS end_step,
           SUM(CASE WHEN r.end_step <= p.last_step THEN 1 ELSE 0 END) AS inside
    FROM spans p
    LEFT JOIN release_ r ON r.engine = p.engine AND r.req_id = p.req_id
         AND r.end_step > p.first_step
    GROUP BY p.engine, p.req_id
),
holds_ AS (
    SELECT a.engine, a.req_id, a.step, a.block_id, e.end_step
    FROM acq a
    JOIN id_ends e ON e.engine = a.engine AND e.req_id = a.req_id
    WHERE e.inside = 0
    UNION ALL
    SELECT a.engine, a.req_id, a.step, a.block_id, MIN(r.end_step) AS end_step
    FROM acq a
    JOIN id_ends e ON e.engine = a.engine AND e.req_id = a.req_id
    LEFT JOIN release_ r ON r.engine = a.engine AND r.req_id = a.req_id AND r.end_step > a.step
    WHERE e.inside > 0
    GROUP BY a.engine, a.req_id, a.step, a.block_id
),
ended AS (
    -- a window group's block is held until its window passes it, if that comes first
    SELECT h.engine, h.req_id, h.step, h.block_id,
           CASE WHEN w.release_step IS NOT NULL
                     AND (h.end_step IS NULL OR w.release_step < h.end_step)
                THEN w.release_step ELSE h.end_step END AS end_step
    FROM holds_ h
    LEFT JOIN window_releases w ON w.engine = h.engine AND w.req_id = h.req_id
         AND w.step = h.step AND w.block_id = h.block_id
)
-- prev_end: the end of the block's previous hold in step order. A block whose holds each
-- start at or after the previous one's end never had two holders at once (the ends then only
-- grow): the checks sweep the other blocks alone, and in a trace without prefix sharing that
-- is almost none of them
SELECT engine, req_id, step, block_id, end_step,
       LAG(COALESCE(end_step, 9223372036854775807)) OVER (
           PARTITION BY engine, block_id ORDER BY step) AS prev_end
FROM ended
"""


# The rows with draft tokens (none at all without speculative decoding): the draft checks read
# these instead of each reading every row's list.
DRAFTS_SQL = """
CREATE VIEW drafts AS
SELECT engine, step, req_id, kind, num_scheduled_tokens, spec_token_ids
FROM scheduled
WHERE spec_token_ids IS NOT NULL
"""

# Names for runs' keys: every instance, and every orphan (run_groups numbers them).
RUN_IDS_SQL = """
CREATE VIEW run_ids AS
SELECT inst, engine, req_id, intro_step, next_intro_step, prompt_len FROM instances
UNION ALL
SELECT o.inst, g.engine, g.req_id, CAST(NULL AS BIGINT) AS intro_step,
       CAST(NULL AS BIGINT) AS next_intro_step, CAST(NULL AS BIGINT) AS prompt_len
FROM (SELECT DISTINCT inst FROM runs WHERE inst < 0) o
JOIN run_groups g ON g.inst = o.inst
"""


def quote(s: str) -> str:
    """A string's body as an SQL literal's (quotes doubled)."""
    return s.replace("'", "''")


# Up to this many engines, the derived views' passes run one engine at a time (per_engine);
# beyond, one pass groups by engine: each branch of the per-engine form filters every table's
# view, itself a branch per engine, and planning grew with the square of the engines
# (bench/RESULTS.md).
PER_ENGINE_UP_TO = 4


def per_engine(select: str, engines: list[str], col: str = "engine",
               split: bool | None = None) -> str:
    """`select` once per engine, joined by UNION ALL, or once for all (`split` False, or more
    than PER_ENGINE_UP_TO engines). In `select`, `{only}` filters rows to the engine, `{pick}`
    is the engine column of a group and `{by}` opens the GROUP BY (`col`: the engine column's
    name there). A GROUP BY over every row that is keyed by engine and an id or a step takes
    longer than the same GROUP BY without the engine: DuckDB hashes a single string key once
    per dictionary entry of the Parquet column, and two keys once per row. Filtered to one
    engine, each branch reads that engine's files alone (the tables' views give each engine a
    branch with its name a constant) and groups without it."""
    names = list(dict.fromkeys(engines))
    if split is None:
        split = len(names) <= PER_ENGINE_UP_TO
    if not split:
        return select.format(only="TRUE", pick=col, by=f"{col}, ")
    literals = [f"'{quote(e)}'" for e in names] or ["NULL"]  # NULL: no rows
    return "\nUNION ALL\n".join(select.format(only=f"{col} = {e}", pick=f"ANY_VALUE({col})",
                                               by="") for e in literals)


def derived_sql(engines: list[str], split: bool | None = None,
                groups: int = 1) -> tuple[str, ...]:
    """The derived views' SQL for a trace of these engines, in creation order (each reads only
    the ones before it); `split`: see per_engine. The catalog reads them, so they are held to
    its portability rules too (tests transpile them to Spark SQL)."""
    views = (REQ_KEYS_SQL.format(ids=per_engine(REQ_KEYS_PASS, engines, split=split)),
            "CREATE VIEW step_totals AS " + per_engine(STEP_TOTALS_PASS, engines, "s.engine",
                                                       split),
            GRANTS_SQL, group_grants_sql(groups), WINDOW_RELEASES_SQL, BLOCK_HOLDS_SQL,
            INSTANCES_SQL,
            DRAFTS_SQL, LIFELINE_SQL,
            RUN_GROUPS_SQL.format(groups=per_engine(RUN_GROUPS_PASS, engines, split=split)),
            WINDOWED_RUNS_SQL, RUNS_SQL, RUN_IDS_SQL)
    return tuple(v.replace("__BLOCKS_S__", blocks_expr("s.new_block_ids", groups))
                 .replace("__BLOCKS__", blocks_expr("new_block_ids", groups)) for v in views)


_CREATE = re.compile(r"\s*CREATE VIEW (\w+) AS\s")


def derived_views(engines: list[str], split: bool | None = None,
                  groups: int = 1) -> dict[str, str]:
    """derived_sql as name -> the SELECT that makes the view, in creation order; `groups`: the
    most KV cache groups an engine has (group_count)."""
    out = {}
    for sql in derived_sql(engines, split, groups):
        m = _CREATE.match(sql)
        out[m.group(1)] = sql[m.end():]
    return out


# The derived views several checks read, which the checker stores once per run
# (Gateway.materialize) before the first check that reads them, directly or through another
# view (deps.stored_before). `runs` itself stays a view: each check reads only its own columns
# of it.
STORED = frozenset({"step_totals", "grants", "group_grants", "window_releases", "block_holds",
                    "drafts",
                    "instances", "run_groups", "windowed_runs", "run_ids"})

VIEW_DOCS = {
    **{name: doc for name, (doc, _) in schema.TABLES.items()},
    "engines": "One row per engine (from its manifest): the settings checks compare against.",
    "dropped": "One row per range of steps the recorder dropped (writer behind).",
    "integrity": "One row per segment whose data fails its checksum (damaged after it was "
                 "written) or whose rows were lost since: engine, segment (its path), details, "
                 "kind ('checksum' or 'lost').",
    "req_keys": "One row per request id listed with tokens in `scheduled` or in "
                "`model_outputs`: engine, req_id, k (a number, unique in its engine).",
    "step_totals": "One row per step with listed requests: engine, step, n (rows with a token "
                   "count), tokens (their sum), ids_fp_0 and ids_fp_1 (the sums of the two "
                   "fingerprints of (step, req_id) over them, see docs/portable-sql.md: "
                   "two steps, or two spans of steps summed, list the same ids when n and both "
                   "sums agree, barring a collision), most_tokens (the largest "
                   "num_computed_tokens + num_scheduled_tokens).",
    "grants": "The `scheduled` rows that hand out blocks or reset a request's block table (new "
              "or resumed): engine, step, req_id, kind, pos, num_computed_tokens, "
              "num_scheduled_tokens, blocks (blocks added to each KV cache group's table), "
              "block_ids (every group's new block ids in one list), group_ids (one list per "
              "group, as recorded).",
    "kv_groups": "One row per KV cache group of an engine (from its manifest): engine, grp "
                 "(its index in new_block_ids), kind (full, sliding_window, chunked_local, mamba, "
                 "cross, encoder_only, other), spec (vLLM's class), block_size, release_offset and "
                 "release_chunk (for groups that free blocks while their request runs: a table's "
                 "first ((computed - offset) // chunk * chunk) // block_size positions are freed; "
                 "NULL for groups that hold every block to the end).",
    "block_holds": "One row per block handed to a request (the null block left out): engine, "
                   "req_id, step (when it was handed out), block_id, end_step (the first step "
                   "it no longer holds it: its preemption, the step after its finish event, "
                   "or its window's release; NULL: held to the trace's end), prev_end (the "
                   "end of the block's previous hold, in step order).",
    "group_grants": "The `grants` rows one per KV cache group: engine, req_id, step, kind, grp, "
                    "num_computed_tokens, num_scheduled_tokens, ids (the group's new block ids, "
                    "the null block 0 included), start (the table position of the first of "
                    "them: 0 for a new or resumed row, whose ids are the whole table).",
    "window_releases": "One row per block a sliding-window, chunked-local or Mamba group handed "
                       "out that its request's window later left behind: engine, req_id, step "
                       "(when it was handed out), grp, block_id, tpos (its position in the "
                       "group's table), release_step (the step whose allocation freed it).",
    "drafts": "The `scheduled` rows with draft tokens: engine, step, req_id, kind, "
              "num_scheduled_tokens, spec_token_ids.",
    "instances": "One row per request instance: inst (an integer key), engine, req_id, intro_step, "
                 "next_intro_step (the id's next introduction), prompt_len, freed_step (the "
                 "first finished_req_ids carrying it).",
    "lifeline": "One row per request instance (an id introduced at intro_step; a reused id is a new "
                "instance): when it ran, how it ended, when its finish reached the worker.",
    "run_groups": "One row per listed request id: whether its rows in `runs` need the window "
                  "(see the columns below).",
    "windowed_runs": "The rows of `runs` of the other ids, which went through its window (same "
                     "columns). A check that only a row unlike the previous step's can break "
                     "reads this alone.",
    "runs": "One row per listed request in a step (the `scheduled` rows with a kind), keyed by "
            "request instance, with the instance's previous listed row (see the columns below).",
    "run_ids": "What runs' `inst` keys name: engine, req_id, intro_step, next_intro_step, "
               "prompt_len (negative keys: ids listed with no introduction before them, run_groups' "
               "`inst`).",
}


# Questions a post-mortem asks, answered over the views (docs/sql-views.md shows them; a test
# runs each on every sample). `vllm-contract sql TRACE "..."` takes any of them as it stands.
EXAMPLES = [
    ("Requests that waited longest for their first token, in steps after their introduction",
     """SELECT r.engine, r.req_id, r.step AS introduced, MIN(o.step) AS first_token,
       MIN(o.step) - r.step AS steps_waited
FROM requests r
JOIN model_outputs o ON o.engine = r.engine AND o.req_id = r.req_id AND o.step >= r.step
                    AND len(o.sampled_token_ids) > 0
GROUP BY r.engine, r.req_id, r.step
ORDER BY steps_waited DESC, r.req_id
LIMIT 10"""),
    ("Preemptions by request",
     """SELECT engine, req_id, COUNT(*) AS preemptions, MIN(step) AS first, MAX(step) AS last
FROM preempted
GROUP BY engine, req_id
ORDER BY preemptions DESC, req_id"""),
    ("Steps that scheduled more tokens than the engine's budget",
     """SELECT s.engine, s.step, s.total_num_scheduled_tokens, e.max_num_batched_tokens
FROM steps s
JOIN engines e ON e.engine = s.engine
WHERE s.total_num_scheduled_tokens > e.max_num_batched_tokens
ORDER BY s.engine, s.step"""),
    ("The slowest schedule() calls, with the queues they faced",
     """SELECT engine, step, schedule_ns / 1e6 AS schedule_ms, num_running, num_waiting, kv_usage
FROM steps
ORDER BY schedule_ns DESC
LIMIT 10"""),
    ("Requests introduced but never freed by a finished id",
     """SELECT engine, req_id, intro_step, last_step, finish_reason
FROM lifeline
WHERE finished_step IS NULL
ORDER BY engine, intro_step"""),
]


def views_markdown() -> str:
    """docs/sql-views.md's view list (generated, so it cannot drift)."""
    out = ["<!-- generated by `python -m vllm_contract.replay.query.views` -->", "",
           "Every table of the trace format is a view with an `engine` column first "
           "(the engine directory's name); see docs/trace-tables.md for their columns. Its "
           "type is `engine_name`, an ENUM of the trace's engines: it compares with string "
           "literals as a VARCHAR would, and grouping, sorting and joining by it cost what an "
           "integer key costs (half the time of a VARCHAR in a window over a million steps). "
           "Arrow receives it as a dictionary column.", "",
           "| view | what |", "|---|---|"]
    out += [f"| `{name}` | {doc} |" for name, doc in VIEW_DOCS.items()]
    out += ["", "`engines` columns: " + ", ".join(f"`{f.name}`" for f in ENGINES_SCHEMA) + ".",
            "", "`dropped` columns: " + ", ".join(f"`{f.name}`" for f in DROPPED_SCHEMA) + ".",
            "", "`engines.steps_recorded` is the manifest's count of steps written; "
            "`engines.pruned_steps` the steps of segments deleted at the size cap "
            "(`pruned_segments`); `engines.stopped_after_step` and `stopped_error` the "
            "manifest's `stopped` (a recorder error ended the recording: its last readable "
            "step, NULL if none, and why). `engines.async_scheduling` is true where the "
            "manifest says so or the recording's scheduler was vLLM's `AsyncScheduler`; "
            "`spec_method` and `num_speculative_tokens` are the manifest's `speculative` (NULL "
            "without a drafter); `pipeline_parallel_size` its `parallel`.",
            "", "`lifeline` columns: `engine`, `req_id`, `intro_step`, `first_step`, `last_step`, "
            "`steps_scheduled`, `tokens_scheduled`, `resumes`, `finish_event_step`, "
            "`finish_reason`, `finished_step` (the step whose finished_req_ids freed it).",
            "", "`instances` columns: `inst` (an integer key), `engine`, `req_id`, `intro_step`, "
            "`next_intro_step`, `prompt_len`, `freed_step`.",
            "", "`runs` columns: `inst` (the request instance: `run_ids` names it), `step`, "
            "`kind`, `num_scheduled_tokens`, `num_computed_tokens`, "
            "`num_output_tokens`, `drafts` (spec tokens in this step, 0 if none), `blocks` (blocks "
            "this row adds to each KV cache group's table); of the "
            "instance's previous listed row: `prev_step`, `prev_end` (its num_computed_tokens + "
            "num_scheduled_tokens), `prev_drafts`. No strings but `kind` travel through its "
            "window: by request id it took several times as long. The checker computes its "
            "windowed part once per run.",
            "", "`run_groups` columns: `engine`, `req_id`, `first_step`, `last_step`, "
            "`first_kind`, "
            "`last_end` (the last row's num_computed_tokens + num_scheduled_tokens), "
            "`most_ahead` (the largest num_computed_tokens + num_scheduled_tokens - "
            "num_output_tokens of its rows), `plain`, `inst` (of a plain id its rows' key; of "
            "another, the negative key its rows take where no introduction precedes them). A check that a plain "
            "id's rows can break only in a way these show reads its rows only when they do. "
            "Plain: listed in every step from its first to its last as one request "
            "instance (or one orphan), cached after its first row, without drafts or missing "
            "counts, each row's num_computed_tokens the previous row's end (checked by sums of "
            "fingerprints). A plain id's previous rows are known without sorting: `runs` sends only "
            "the other ids' rows through its window."]
    out += ["", "## Example queries", "",
            "Each runs as it stands: `vllm-contract sql TRACE \"...\"` (or at the prompt, "
            "ended with `;`)."]
    for question, query in EXAMPLES:
        out += ["", f"{question}:", "", "```sql", query, "```"]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(views_markdown(), end="")
