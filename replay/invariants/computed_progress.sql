-- id: computed.progress
-- severity: error
-- title: num_computed_tokens does not advance by scheduled minus rejected tokens
-- why: The worker writes KV at positions num_computed_tokens onwards; if the scheduler's count
--      moves backwards or skips without a preemption, the model attends to missing or stale KV
--      and produces silently wrong tokens.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._update_after_schedule / update_from_output
-- needs: scheduled, model_outputs, preempted
-- columns: engine, step, req_id, details
-- note: across a preemption the count restarts (resumed requests recompute); after one the next
--       row is not compared. Rejected drafts = drafts scheduled - (tokens sampled - 1).
WITH runs AS (
    SELECT engine, step, req_id, kind, num_computed_tokens, num_scheduled_tokens,
           CARDINALITY(spec_token_ids) AS drafts
    FROM scheduled
    WHERE kind IS NOT NULL AND num_scheduled_tokens IS NOT NULL
),
advanced AS (
    -- where each run leaves the request: computed + scheduled - rejected drafts (only rows
    -- with drafts need the model output, so only they are joined with it)
    SELECT engine, step, req_id, num_computed_tokens + num_scheduled_tokens AS expected
    FROM runs
    WHERE drafts IS NULL OR drafts = 0
    UNION ALL
    SELECT r.engine, r.step, r.req_id,
           r.num_computed_tokens + r.num_scheduled_tokens
           - CASE WHEN CARDINALITY(m.sampled_token_ids) > 0
                  THEN r.drafts - (CARDINALITY(m.sampled_token_ids) - 1) ELSE 0 END AS expected
    FROM runs r
    LEFT JOIN model_outputs m ON m.engine = r.engine AND m.step = r.step AND m.req_id = r.req_id
    WHERE r.drafts > 0
),
cur AS (
    SELECT engine, step, req_id, num_computed_tokens FROM runs WHERE kind = 'cached'
),
adjacent AS (
    -- the common case, ran in the step before: an equality join, no sort
    SELECT c.engine, c.step, c.req_id, c.num_computed_tokens, a.step AS prev_step, a.expected
    FROM cur c
    JOIN advanced a ON a.engine = c.engine AND a.req_id = c.req_id AND a.step = c.step - 1
),
gap_rows AS (
    SELECT c.engine, c.step, c.req_id, c.num_computed_tokens
    FROM cur c
    LEFT JOIN advanced a ON a.engine = c.engine AND a.req_id = c.req_id AND a.step = c.step - 1
    WHERE a.req_id IS NULL
),
gap_prev AS (
    SELECT g.engine, g.step, g.req_id, g.num_computed_tokens, MAX(a.step) AS prev_step
    FROM gap_rows g
    JOIN advanced a ON a.engine = g.engine AND a.req_id = g.req_id AND a.step < g.step
    GROUP BY g.engine, g.step, g.req_id, g.num_computed_tokens
),
pairs AS (
    SELECT engine, step, req_id, num_computed_tokens, prev_step, expected FROM adjacent
    UNION ALL
    SELECT g.engine, g.step, g.req_id, g.num_computed_tokens, g.prev_step, a.expected
    FROM gap_prev g
    JOIN advanced a ON a.engine = g.engine AND a.req_id = g.req_id AND a.step = g.prev_step
)
SELECT p.engine, p.step, p.req_id,
       'num_computed_tokens ' || CAST(p.num_computed_tokens AS VARCHAR) || ', expected '
       || CAST(p.expected AS VARCHAR) || ' from step ' || CAST(p.prev_step AS VARCHAR) AS details
FROM pairs p
LEFT JOIN preempted q ON q.engine = p.engine AND q.req_id = p.req_id
     AND q.step > p.prev_step AND q.step <= p.step
WHERE q.step IS NULL AND p.num_computed_tokens <> p.expected
