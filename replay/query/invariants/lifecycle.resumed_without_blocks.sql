-- id: lifecycle.resumed_without_blocks
-- severity: error
-- title: a resumed request comes without its replacement block table
-- why: For a resumed request the worker replaces its block table with new_block_ids and asserts
--      it is not None; without it the request would read the blocks it lost when preempted.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled
-- columns: engine, step, req_id, details
SELECT engine, step, req_id, 'resumed with new_block_ids = None' AS details
FROM scheduled
WHERE kind = 'resumed' AND new_block_ids IS NULL
