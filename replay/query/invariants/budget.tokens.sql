-- id: budget.tokens
-- severity: error
-- title: a step schedules more tokens than max_num_batched_tokens
-- why: Worker buffers (input ids, positions, attention metadata) are allocated for the token
--      budget at start-up; a larger batch overflows them.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner.__init__ (buffer sizes)
-- needs: steps, engines
-- columns: engine, step, req_id (NULL), details
SELECT s.engine, s.step, CAST(NULL AS VARCHAR) AS req_id,
       CAST(s.total_num_scheduled_tokens AS VARCHAR) || ' tokens > max_num_batched_tokens '
       || CAST(e.max_num_batched_tokens AS VARCHAR) AS details
FROM steps s JOIN engines e ON e.engine = s.engine
WHERE e.max_num_batched_tokens IS NOT NULL
  AND s.total_num_scheduled_tokens > e.max_num_batched_tokens
