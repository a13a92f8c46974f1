-- id: encoder.unscheduled
-- severity: error
-- title: encoder inputs for a request that is not scheduled in this step
-- why: The worker runs the encoder for scheduled requests only and maps outputs through their
--      positions; inputs for an unscheduled request have no place in the batch.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._execute_mm_encoder
-- needs: scheduled
-- columns: engine, step, req_id, details
SELECT engine, step, req_id, 'scheduled_encoder_inputs without scheduled tokens' AS details
FROM scheduled
WHERE encoder_inputs IS NOT NULL AND num_scheduled_tokens IS NULL
