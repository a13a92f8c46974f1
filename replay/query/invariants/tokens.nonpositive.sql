-- id: tokens.nonpositive
-- severity: error
-- title: a request is scheduled zero or fewer tokens
-- why: The worker builds positions and slot mappings from the count; 0 or less corrupts the
--      batch layout (and a zero-token entry still makes the request part of the batch).
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_inputs
-- needs: scheduled
-- columns: engine, step, req_id, details
SELECT engine, step, req_id,
       'num_scheduled_tokens = ' || CAST(num_scheduled_tokens AS VARCHAR) AS details
FROM scheduled
WHERE num_scheduled_tokens <= 0
