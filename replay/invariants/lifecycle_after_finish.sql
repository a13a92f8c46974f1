-- id: lifecycle.scheduled_after_finish
-- severity: error
-- title: a cached request scheduled after its finish reached the worker
-- why: The worker dropped the request's state when the id arrived in finished_req_ids; the
--      next scheduled_cached_reqs entry for it is a KeyError.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, requests, finished
-- columns: engine, step, req_id, details
SELECT s.engine, s.step, s.req_id,
       'freed by finished_req_ids at step ' || CAST(i.freed_step AS VARCHAR)
       || ', introduced at step ' || CAST(i.intro_step AS VARCHAR) AS details
FROM scheduled s
JOIN instances i ON i.engine = s.engine AND i.req_id = s.req_id AND s.step >= i.intro_step
     AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
WHERE s.kind IN ('cached', 'resumed') AND i.freed_step < s.step
