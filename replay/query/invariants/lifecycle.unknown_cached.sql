-- id: lifecycle.unknown_cached
-- severity: error
-- title: a cached request the worker never saw introduced
-- why: For every scheduled_cached_reqs entry the worker looks up self.requests[req_id]: an id
--      never sent in scheduled_new_reqs is a KeyError deep in the model runner.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, runs, run_ids, finished, engines
-- columns: engine, step, req_id, details
-- note: a trace started by attaching to a running engine (engines.attached_mid_stream) began with
--       requests already introduced; those are not blamed unless their id was freed before.
WITH unknown AS (
    -- rows of no introduced instance (runs gives them negative keys)
    SELECT k.engine, r.step, k.req_id
    FROM runs r
    JOIN run_ids k ON k.inst = r.inst
    WHERE r.inst < 0 AND r.kind IN ('cached', 'resumed')
),
freed_before AS (
    SELECT DISTINCT u.engine, u.step, u.req_id
    FROM unknown u
    JOIN finished f ON f.engine = u.engine AND f.req_id = u.req_id AND f.step <= u.step
)
SELECT u.engine, u.step, u.req_id,
       'scheduled as cached but never introduced in scheduled_new_reqs' AS details
FROM unknown u
JOIN engines e ON e.engine = u.engine
LEFT JOIN freed_before b ON b.engine = u.engine AND b.step = u.step AND b.req_id = u.req_id
WHERE NOT e.attached_mid_stream OR b.req_id IS NOT NULL
