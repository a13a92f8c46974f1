-- id: lifecycle.scheduled_after_finish
-- severity: error
-- title: a cached request scheduled after its finish reached the worker
-- why: The worker dropped the request's state when the id arrived in finished_req_ids; the
--      next scheduled_cached_reqs entry for it is a KeyError.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, requests, finished
-- columns: engine, step, req_id, details
WITH ev AS (
    SELECT engine, req_id, step, 1 AS ord, 'finish' AS what FROM finished
    UNION ALL
    SELECT engine, req_id, step, 2 AS ord, 'intro' AS what FROM requests
    UNION ALL
    SELECT engine, req_id, step, 3 AS ord, 'cached' AS what FROM scheduled
    WHERE kind IN ('cached', 'resumed')
),
state AS (
    SELECT engine, req_id, step, what,
           MAX(CASE WHEN what = 'intro' THEN step END) OVER (
               PARTITION BY engine, req_id ORDER BY step, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS last_intro,
           MAX(CASE WHEN what = 'finish' THEN step END) OVER (
               PARTITION BY engine, req_id ORDER BY step, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS last_finish
    FROM ev
)
SELECT engine, step, req_id,
       'freed by finished_req_ids at step ' || CAST(last_finish AS VARCHAR)
       || ', introduced at step ' || CAST(last_intro AS VARCHAR) AS details
FROM state
WHERE what = 'cached' AND last_finish > last_intro AND last_finish < step
