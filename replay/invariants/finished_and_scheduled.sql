-- id: finished.and_scheduled
-- severity: error
-- title: an id is in finished_req_ids and scheduled as cached in the same step
-- why: The worker frees finished ids first, then looks the cached request up: KeyError. (An id
--      finished and re-introduced as new in one step is id reuse, and fine.)
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, finished
-- columns: engine, step, req_id, details
SELECT s.engine, s.step, s.req_id,
       'in finished_req_ids and scheduled_cached_reqs of the same step' AS details
FROM scheduled s
JOIN finished f ON f.engine = s.engine AND f.step = s.step AND f.req_id = s.req_id
WHERE s.kind IN ('cached', 'resumed')
