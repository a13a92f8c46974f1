-- id: trace.malformed_step
-- severity: error
-- title: a SchedulerOutput of the wrong shape, kept whole in malformed_steps
-- why: The recorder could not put this step in the tables: parallel lists of unequal length,
--      None where a list belongs, a value of the wrong type. The worker indexes these lists
--      in lockstep and trusts their types; the same output crashes it or corrupts its state.
--      The step's plain form is in malformed_steps.plain_json (`vllm-contract sql`).
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: malformed_steps
-- columns: engine, step, req_id (NULL), details
SELECT engine, step, CAST(NULL AS VARCHAR) AS req_id, stage || ': ' || error AS details
FROM malformed_steps
WHERE stage <> 'update'
