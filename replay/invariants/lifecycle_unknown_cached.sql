-- id: lifecycle.unknown_cached
-- severity: error
-- title: a cached request the worker never saw introduced
-- why: For every scheduled_cached_reqs entry the worker looks up self.requests[req_id]: an id
--      never sent in scheduled_new_reqs is a KeyError deep in the model runner.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, requests, finished
-- columns: engine, step, req_id, details
-- note: a trace started by attaching to a running engine (engines.attached_mid_stream) began with
--       requests already introduced; those are not blamed unless their id was freed before.
WITH cached AS (
    SELECT engine, step, req_id FROM scheduled WHERE kind IN ('cached', 'resumed')
),
freed_before AS (
    SELECT DISTINCT c.engine, c.step, c.req_id
    FROM cached c
    JOIN finished f ON f.engine = c.engine AND f.req_id = c.req_id AND f.step <= c.step
    LEFT JOIN (SELECT engine, req_id, MIN(intro_step) AS first_intro FROM instances
               GROUP BY engine, req_id) i ON i.engine = c.engine AND i.req_id = c.req_id
    WHERE i.first_intro IS NULL OR i.first_intro > c.step
)
SELECT c.engine, c.step, c.req_id,
       'scheduled as cached but never introduced in scheduled_new_reqs' AS details
FROM cached c
JOIN engines e ON e.engine = c.engine
LEFT JOIN instances i ON i.engine = c.engine AND i.req_id = c.req_id AND c.step >= i.intro_step
     AND (i.next_intro_step IS NULL OR c.step < i.next_intro_step)
LEFT JOIN freed_before b ON b.engine = c.engine AND b.step = c.step AND b.req_id = c.req_id
WHERE i.req_id IS NULL AND (NOT e.attached_mid_stream OR b.req_id IS NOT NULL)
