-- id: computed.progress
-- severity: error
-- title: num_computed_tokens does not advance by scheduled minus rejected tokens
-- why: The worker writes KV at positions num_computed_tokens onwards; if the scheduler's count
--      moves backwards or skips without a preemption, the model attends to missing or stale KV
--      and produces silently wrong tokens.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._update_after_schedule / update_from_output
-- needs: scheduled, windowed_runs, run_ids, model_outputs, preempted
-- columns: engine, step, req_id, details
-- note: across a preemption the count restarts (resumed requests recompute); after one the next
--       row is not compared. Rejected drafts = drafts scheduled - (tokens sampled - 1).
WITH cand AS (
    -- rows that can break: a count other than the previous row's end, or drafts to account
    -- for (only those are joined with the model output)
    SELECT inst, step, num_computed_tokens, prev_step, prev_end AS upper_, prev_drafts
    FROM windowed_runs
    WHERE kind = 'cached' AND num_scheduled_tokens IS NOT NULL AND prev_step IS NOT NULL
      AND (prev_drafts > 0 OR num_computed_tokens <> prev_end)
),
pairs AS (
    SELECT k.engine, c.step, k.req_id, c.num_computed_tokens, c.prev_step,
           c.upper_ - CASE WHEN c.prev_drafts > 0 AND CARDINALITY(m.sampled_token_ids) > 0
                           THEN c.prev_drafts - (CARDINALITY(m.sampled_token_ids) - 1)
                           ELSE 0 END AS expected
    FROM cand c
    JOIN run_ids k ON k.inst = c.inst
    LEFT JOIN model_outputs m ON m.engine = k.engine AND m.step = c.prev_step
         AND m.req_id = k.req_id
)
SELECT p.engine, p.step, p.req_id,
       'num_computed_tokens ' || CAST(p.num_computed_tokens AS VARCHAR) || ', expected '
       || CAST(p.expected AS VARCHAR) || ' from step ' || CAST(p.prev_step AS VARCHAR) AS details
FROM pairs p
LEFT JOIN preempted q ON q.engine = p.engine AND q.req_id = p.req_id
     AND q.step > p.prev_step AND q.step <= p.step
WHERE q.step IS NULL AND p.num_computed_tokens <> p.expected
