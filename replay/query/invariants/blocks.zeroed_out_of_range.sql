-- id: blocks.zeroed_out_of_range
-- severity: error
-- title: a block id to zero outside the KV cache
-- why: The worker zeroes new_block_ids_to_zero in place at the start of the step
--      (GPUModelRunner._zero_block_ids, in _update_states): each id is a row of every KV cache
--      tensor, and one past the end writes outside them.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states / _zero_block_ids;
--      vllm/v1/core/sched/scheduler.py Scheduler._get_new_block_ids_to_zero
-- needs: steps, engines
-- columns: engine, step, req_id (NULL), details
-- note: the scheduler sends the list only when the KV cache needs zeroing (Mamba layers, or
--       caches of mixed precision: KVCacheConfig.needs_kv_cache_zeroing); elsewhere it is NULL
--       and this reads nothing.
WITH zeroed AS (
    SELECT engine, step, UNNEST(new_block_ids_to_zero) AS block_id
    FROM steps
    WHERE new_block_ids_to_zero IS NOT NULL
)
SELECT z.engine, z.step, CAST(NULL AS VARCHAR) AS req_id,
       'block id ' || CAST(MIN(z.block_id) AS VARCHAR) || '..' || CAST(MAX(z.block_id) AS VARCHAR)
       || ' to zero outside 0..' || CAST(e.num_kv_blocks - 1 AS VARCHAR) AS details
FROM zeroed z JOIN engines e ON e.engine = z.engine
WHERE e.num_kv_blocks IS NOT NULL AND (z.block_id >= e.num_kv_blocks OR z.block_id < 0)
GROUP BY z.engine, z.step, e.num_kv_blocks
