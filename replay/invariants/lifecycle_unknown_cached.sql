-- id: lifecycle.unknown_cached
-- severity: error
-- title: a cached request the worker never saw introduced
-- why: For every scheduled_cached_reqs entry the worker looks up self.requests[req_id]: an id
--      never sent in scheduled_new_reqs is a KeyError deep in the model runner.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, requests, finished
-- columns: engine, step, req_id, details
-- note: a trace started by attaching to a running engine (engines.attached_mid_stream) began with
--       requests already introduced; those are not blamed.
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
SELECT s.engine, s.step, s.req_id,
       'scheduled as cached but never introduced in scheduled_new_reqs' AS details
FROM state s JOIN engines e ON e.engine = s.engine
WHERE s.what = 'cached' AND s.last_intro IS NULL
  AND NOT (e.attached_mid_stream AND s.last_finish IS NULL)
