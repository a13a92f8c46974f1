-- id: tokens.listed_without_tokens
-- severity: error
-- title: a new or cached request has no num_scheduled_tokens entry
-- why: The worker looks up num_scheduled_tokens[req_id] for every request in the batch: a
--      KeyError, or a request kept in the batch with no tokens.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_inputs
-- needs: scheduled
-- columns: engine, step, req_id, details
SELECT engine, step, req_id, kind || ' request without a num_scheduled_tokens entry' AS details
FROM scheduled
WHERE kind IS NOT NULL AND num_scheduled_tokens IS NULL
