-- id: tokens.unlisted_request
-- severity: error
-- title: tokens scheduled for a request that is neither new nor cached in this step
-- why: The worker only knows requests from scheduled_new_reqs and scheduled_cached_reqs; an id
--      that appears only in num_scheduled_tokens has no state and no block table.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled
-- columns: engine, step, req_id, details
SELECT engine, step, req_id,
       'in num_scheduled_tokens (' || CAST(num_scheduled_tokens AS VARCHAR)
       || ') but in neither scheduled_new_reqs nor scheduled_cached_reqs' AS details
FROM scheduled
WHERE kind IS NULL AND num_scheduled_tokens IS NOT NULL
