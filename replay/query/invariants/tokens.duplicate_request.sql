-- id: tokens.duplicate_request
-- severity: error
-- title: a request id is listed twice among the step's new and cached requests
-- why: The worker would add the request twice to its persistent batch, or treat a new entry
--      for a cached id as a streaming update; either way two rows share one request's state.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, windowed_runs, run_ids
-- columns: engine, step, req_id, details
-- note: an id listed twice in one step is never plain (run_groups): windowed_runs has its rows.
WITH dup AS (
    -- ordered by step, an instance listed twice in one step follows itself
    SELECT DISTINCT inst, step FROM windowed_runs WHERE prev_step = step
)
SELECT k.engine, r.step, k.req_id,
       'listed ' || CAST(COUNT(*) AS VARCHAR) || ' times (' || STRING_AGG(r.kind, ', ' ORDER BY r.kind) || ')'
       AS details
FROM windowed_runs r
JOIN dup d ON d.inst = r.inst AND d.step = r.step
JOIN run_ids k ON k.inst = r.inst
GROUP BY k.engine, r.step, k.req_id
