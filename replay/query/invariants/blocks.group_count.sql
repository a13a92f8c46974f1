-- id: blocks.group_count
-- severity: error
-- title: a block table grant with a list count other than the engine's KV cache groups
-- why: The worker indexes new_block_ids by KV cache group, one list each: a new request's
--      block_ids with fewer lists raise IndexError in BlockTable.add_row; extra lists are
--      silently ignored, and with them the blocks the scheduler handed out for that group.
-- relies_on: vllm/v1/worker/block_table.py MultiGroupBlockTable.add_row / append_row;
--      vllm/v1/core/kv_cache_manager.py KVCacheBlocks.get_block_ids
-- needs: grants, kv_groups
-- columns: engine, step, req_id, details
-- note: compared only on engines whose manifest records their KV cache groups.
WITH counts AS (
    SELECT engine, COUNT(*) AS n FROM kv_groups GROUP BY engine
)
SELECT g.engine, g.step, g.req_id,
       CAST(CARDINALITY(g.group_ids) AS VARCHAR) || ' block list(s) for '
       || CAST(c.n AS VARCHAR) || ' KV cache group(s)' AS details
FROM grants g
JOIN counts c ON c.engine = g.engine
WHERE g.kind IS NOT NULL AND g.group_ids IS NOT NULL AND CARDINALITY(g.group_ids) <> c.n
