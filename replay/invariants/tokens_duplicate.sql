-- id: tokens.duplicate_request
-- severity: error
-- title: a request id is listed twice among the step's new and cached requests
-- why: The worker would add the request twice to its persistent batch, or treat a new entry
--      for a cached id as a streaming update; either way two rows share one request's state.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, runs, run_ids
-- columns: engine, step, req_id, details
WITH dup AS (
    -- ordered by step, an instance listed twice in one step follows itself
    SELECT DISTINCT inst, step FROM runs WHERE prev_step = step
)
SELECT k.engine, r.step, k.req_id,
       'listed ' || CAST(COUNT(*) AS VARCHAR) || ' times (' || STRING_AGG(r.kind, ', ') || ')'
       AS details
FROM runs r
JOIN dup d ON d.inst = r.inst AND d.step = r.step
JOIN run_ids k ON k.inst = r.inst
GROUP BY k.engine, r.step, k.req_id
