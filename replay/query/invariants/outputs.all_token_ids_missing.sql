-- id: outputs.all_token_ids_missing
-- severity: error
-- title: a request that comes back into the batch under async scheduling lacks the token ids its outputs are rebuilt from
-- why: With async scheduling, for a cached request that is not in the persistent batch (resumed,
--      or given no token count in the step before) and has outputs, the worker rebuilds its
--      output_token_ids from the last num_output_tokens entries of
--      CachedRequestData.all_token_ids[req_id]. Without the key it raises KeyError; with fewer
--      entries than num_output_tokens it takes them all as the outputs, and the next input ids
--      and penalties are wrong (silent).
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states (use_async_scheduling, req_index None); vllm/v1/core/sched/scheduler.py Scheduler._make_cached_request_data (prev_step_scheduled_req_ids)
-- needs: windowed_runs, run_ids, engines, scheduled, redacted (if present)
-- columns: engine, step, req_id, details
-- note: async engines only: the sync worker keeps a preempted request's outputs and never
--       reads the field (the scheduler sends it anyway). A redacted list (the `redacted` row of
--       field 'all_token_ids') counts as sent, with its recorded length. An engine none of whose
--       rows that need the field carries it, and that resumes nothing, is not checked: vLLM's
--       model runner V2 gets resumed requests as new ones and no all_token_ids at all, and the
--       manifest does not say which runner ran. Not reported: an id's first rows in a trace
--       attached mid-stream (no introduction: its previous step is unknown).
WITH needing AS (
    -- rows of the ids that are not plain: a plain id's every row after its first has a token
    -- count in the step before, and its first row is its introduction
    SELECT k.engine, w.step, k.req_id, w.kind, w.num_output_tokens, w.prev_step, w.prev_end
    FROM windowed_runs w
    JOIN run_ids k ON k.inst = w.inst
    JOIN engines e ON e.engine = k.engine
    WHERE e.async_scheduling AND w.inst > 0 AND w.kind IN ('cached', 'resumed')
      AND w.num_output_tokens > 0
      AND (w.kind = 'resumed' OR w.prev_step IS NULL OR w.prev_step < w.step - 1
           OR w.prev_end IS NULL)
),
sent AS (
    -- every row of `windowed_runs` is a `scheduled` row: an inner join, whose small side is
    -- built (when no row needs the field, `scheduled` is not read at all)
    SELECT n.engine, n.step, n.req_id, n.kind, n.num_output_tokens, n.prev_step,
           CASE WHEN s.all_token_ids IS NOT NULL THEN CARDINALITY(s.all_token_ids)
                ELSE r.length END AS n_sent
    FROM needing n
    JOIN scheduled s ON s.engine = n.engine AND s.step = n.step AND s.req_id = n.req_id
    LEFT JOIN redacted r ON r.engine = n.engine AND r.step = n.step AND r.req_id = n.req_id
         AND r.field = 'all_token_ids'
),
model_runner_v1 AS (
    SELECT engine FROM sent
    GROUP BY engine
    HAVING SUM(CASE WHEN kind = 'resumed' OR n_sent IS NOT NULL THEN 1 ELSE 0 END) > 0
)
SELECT s.engine, s.step, s.req_id,
       CASE WHEN s.kind = 'resumed' THEN 'resumed'
            WHEN s.prev_step IS NULL THEN 'cached, not listed before'
            ELSE 'cached, no token count at step ' || CAST(s.step - 1 AS VARCHAR) END
       || ' with num_output_tokens ' || CAST(s.num_output_tokens AS VARCHAR) || ': '
       || CASE WHEN s.n_sent IS NULL THEN 'no all_token_ids (KeyError in the worker)'
               ELSE 'all_token_ids holds ' || CAST(s.n_sent AS VARCHAR) || ' tokens' END
       AS details
FROM sent s
JOIN model_runner_v1 v ON v.engine = s.engine
WHERE s.n_sent IS NULL OR s.n_sent < s.num_output_tokens
