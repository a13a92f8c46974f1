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
    SELECT s.engine, s.step, s.req_id, s.kind, s.num_computed_tokens, s.num_scheduled_tokens,
           CARDINALITY(s.spec_token_ids) AS drafts, CARDINALITY(m.sampled_token_ids) AS sampled
    FROM scheduled s
    LEFT JOIN model_outputs m ON m.engine = s.engine AND m.step = s.step AND m.req_id = s.req_id
    WHERE s.kind IS NOT NULL AND s.num_scheduled_tokens IS NOT NULL
),
paired AS (
    SELECT r.engine, r.step, r.req_id, r.kind, r.num_computed_tokens,
           LAG(r.step) OVER (PARTITION BY r.engine, r.req_id ORDER BY r.step) AS prev_step,
           LAG(r.num_computed_tokens + r.num_scheduled_tokens
               - CASE WHEN r.drafts > 0 AND r.sampled > 0 THEN r.drafts - (r.sampled - 1)
                      ELSE 0 END) OVER (PARTITION BY r.engine, r.req_id ORDER BY r.step)
               AS expected
    FROM runs r
),
preempts AS (
    SELECT engine, req_id, step FROM preempted
)
SELECT p.engine, p.step, p.req_id,
       'num_computed_tokens ' || CAST(p.num_computed_tokens AS VARCHAR) || ', expected '
       || CAST(p.expected AS VARCHAR) || ' from step ' || CAST(p.prev_step AS VARCHAR) AS details
FROM paired p
LEFT JOIN preempts q ON q.engine = p.engine AND q.req_id = p.req_id
     AND q.step > p.prev_step AND q.step <= p.step
WHERE p.kind = 'cached' AND p.prev_step IS NOT NULL AND q.step IS NULL
  AND p.num_computed_tokens <> p.expected
