-- id: tokens.total_mismatch
-- severity: error
-- title: total_num_scheduled_tokens differs from the sum of num_scheduled_tokens
-- why: The worker sizes its input buffers from the total and fills them per request; a mismatch
--      reads past, or leaves garbage in, the batch.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_inputs
-- needs: steps, scheduled, step_totals
-- columns: engine, step, req_id (NULL), details
SELECT s.engine, s.step, CAST(NULL AS VARCHAR) AS req_id,
       'total ' || CAST(s.total_num_scheduled_tokens AS VARCHAR) || ' != sum '
       || CAST(COALESCE(p.tokens, 0) AS VARCHAR) AS details
FROM steps s
LEFT JOIN step_totals p ON p.engine = s.engine AND p.step = s.step
WHERE s.total_num_scheduled_tokens <> COALESCE(p.tokens, 0)
