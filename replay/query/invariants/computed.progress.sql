-- id: computed.progress
-- severity: error
-- title: num_computed_tokens does not advance by scheduled minus rejected tokens
-- why: The worker writes KV at positions num_computed_tokens onwards; if the scheduler's count
--      moves backwards or skips without a preemption, the model attends to missing or stale KV
--      and produces silently wrong tokens.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._update_after_schedule / update_from_output
-- needs: scheduled, windowed_runs, run_ids, model_outputs, preempted, steps, updates
-- columns: engine, step, req_id, details
-- note: across a preemption the count restarts (resumed requests recompute); after one the next
--       row is not compared. Rejected drafts = drafts scheduled - (tokens sampled - 1); the
--       scheduler learns of them in the step's update, so they come off the count it sends
--       with the request's first row scheduled after that update: the next row, except where
--       batches overlap (async scheduling: the next row was scheduled before the update, with
--       the count as if every draft were accepted, and the rejections come off a row later).
WITH outcomes AS (
    -- the rows with drafts, and how many of their drafts the model rejected
    SELECT w.inst, w.step, w.drafts - (CARDINALITY(m.sampled_token_ids) - 1) AS rejected
    FROM windowed_runs w
    JOIN run_ids k ON k.inst = w.inst
    JOIN model_outputs m ON m.engine = k.engine AND m.step = w.step AND m.req_id = k.req_id
    WHERE w.drafts > 0 AND CARDINALITY(m.sampled_token_ids) > 0
),
ranked AS (
    -- the rows of the requests that had drafts, numbered in step order, with when each step's
    -- schedule() returned
    SELECT w.inst, w.step, t.t_ns AS scheduled_t,
           ROW_NUMBER() OVER (PARTITION BY w.inst ORDER BY w.step) AS rn
    FROM windowed_runs w
    JOIN (SELECT DISTINCT inst FROM outcomes) d ON d.inst = w.inst
    JOIN run_ids k ON k.inst = w.inst
    JOIN steps t ON t.engine = k.engine AND t.step = w.step
),
offsets AS (
    -- a batch queue holds as many batches as pipeline stages: the row is among the next few
    SELECT UNNEST(RANGE(1, 17)) AS d
),
applied AS (
    -- the first later row scheduled after the update by the clock; where all sixteen are
    -- there and none was (a wall clock set back, in a trace recorded before t_ns came from a
    -- monotonic clock), the next one
    SELECT o.inst, o.step, o.rejected,
           COALESCE(MIN(CASE WHEN n.scheduled_t > u.t_ns THEN n.step END),
                    CASE WHEN COUNT(*) = 16 THEN MIN(n.step) END) AS applied_step
    FROM outcomes o
    JOIN ranked r ON r.inst = o.inst AND r.step = o.step
    JOIN run_ids k ON k.inst = o.inst
    JOIN updates u ON u.engine = k.engine AND u.step = o.step
    CROSS JOIN offsets f
    JOIN ranked n ON n.inst = o.inst AND n.rn = r.rn + f.d
    GROUP BY o.inst, o.step, o.rejected
),
owed AS (
    SELECT inst, applied_step AS step, SUM(rejected) AS rejected
    FROM applied
    WHERE applied_step IS NOT NULL
    GROUP BY inst, applied_step
),
pairs AS (
    SELECT k.engine, w.step, k.req_id, w.num_computed_tokens, w.prev_step,
           w.prev_end - COALESCE(o.rejected, 0) AS expected
    FROM windowed_runs w
    JOIN run_ids k ON k.inst = w.inst
    LEFT JOIN owed o ON o.inst = w.inst AND o.step = w.step
    WHERE w.kind = 'cached' AND w.num_scheduled_tokens IS NOT NULL AND w.prev_step IS NOT NULL
      AND w.num_computed_tokens <> w.prev_end - COALESCE(o.rejected, 0)
)
SELECT p.engine, p.step, p.req_id,
       'num_computed_tokens ' || CAST(p.num_computed_tokens AS VARCHAR) || ', expected '
       || CAST(p.expected AS VARCHAR) || ' from step ' || CAST(p.prev_step AS VARCHAR) AS details
FROM pairs p
LEFT JOIN preempted q ON q.engine = p.engine AND q.req_id = p.req_id
     AND q.step > p.prev_step AND q.step <= p.step
WHERE q.step IS NULL
