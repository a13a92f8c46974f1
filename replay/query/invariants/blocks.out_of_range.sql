-- id: blocks.out_of_range
-- severity: error
-- title: a block id outside the KV cache
-- why: Block ids index the KV cache tensors directly; on CPU they are not bounds-checked, and an
--      id past the end segfaulted or hung the worker here.
-- relies_on: vllm/v1/worker/block_table.py BlockTable.append_row / add_row
-- needs: scheduled, grants, engines
-- columns: engine, step, req_id, details
WITH ids AS (
    SELECT engine, step, req_id, UNNEST(block_ids) AS block_id FROM grants
)
SELECT i.engine, i.step, i.req_id,
       'block id ' || CAST(MIN(i.block_id) AS VARCHAR) || '..' || CAST(MAX(i.block_id) AS VARCHAR)
       || ' outside 0..' || CAST(e.num_kv_blocks - 1 AS VARCHAR) AS details
FROM ids i JOIN engines e ON e.engine = i.engine
WHERE e.num_kv_blocks IS NOT NULL AND (i.block_id >= e.num_kv_blocks OR i.block_id < 0)
GROUP BY i.engine, i.step, i.req_id, e.num_kv_blocks
