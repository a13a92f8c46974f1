-- id: tokens.duplicate_request
-- severity: error
-- title: a request id is listed twice among the step's new and cached requests
-- why: The worker would add the request twice to its persistent batch, or treat a new entry
--      for a cached id as a streaming update; either way two rows share one request's state.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled
-- columns: engine, step, req_id, details
WITH per_step AS (
    SELECT engine, step FROM scheduled
    WHERE kind IS NOT NULL
    GROUP BY engine, step
    HAVING COUNT(*) > COUNT(DISTINCT req_id)
)
SELECT s.engine, s.step, s.req_id,
       'listed ' || CAST(COUNT(*) AS VARCHAR) || ' times (' || STRING_AGG(s.kind, ', ') || ')'
       AS details
FROM scheduled s
JOIN per_step p ON p.engine = s.engine AND p.step = s.step
WHERE s.kind IS NOT NULL
GROUP BY s.engine, s.step, s.req_id
HAVING COUNT(*) > 1
