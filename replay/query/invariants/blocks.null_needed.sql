-- id: blocks.null_needed
-- severity: error
-- title: the null block where a request's attention or state needs a real one
-- why: Block 0 is vLLM's null block, a placeholder that sliding-window and Mamba groups put
--      where their window has left a block behind. It holds nobody's KV and every table that
--      carries it shares its slots: a token whose KV or state is written there is lost to its
--      request, and a read of it reads whatever another request left (silently wrong tokens).
-- relies_on: vllm/v1/core/block_pool.py BlockPool.null_block;
--      vllm/v1/core/single_type_kv_cache_manager.py remove_skipped_blocks,
--      SlidingWindowManager.find_longest_cache_hit, MambaManager.allocate_new_blocks;
--      vllm/v1/worker/block_table.py BlockTable.compute_slot_mapping;
--      vllm/v1/worker/mamba_utils.py (a new or resumed request's prev_state_idx)
-- needs: group_grants, kv_groups, engines
-- columns: engine, step, req_id, details
-- note: in an attention group (full, sliding window, chunked local) every table position from
--       the first one the request's window still covers on is read or written (from 0 in full
--       attention; core/kv_groups.py for the others, at the row's num_computed_tokens): a
--       grant's last null block is compared with it. In a Mamba group a grant's last block is
--       the state its step writes (the ones before it are nulls by design in "align" mode),
--       and a new or resumed request with computed tokens (a prefix hit) starts from the state
--       at position cdiv(num_computed_tokens, block size) - 1: a table that ends before it, or
--       has the null block there, makes the worker read no state or the null block's.
--       Where the manifest names no groups, the engine has one full-attention group.
WITH groups_ AS (
    SELECT engine, grp, kind, block_size, release_offset, release_chunk FROM kv_groups
    UNION ALL
    SELECT e.engine, CAST(0 AS BIGINT) AS grp, 'full' AS kind, e.block_size,
           CAST(NULL AS BIGINT) AS release_offset, CAST(NULL AS BIGINT) AS release_chunk
    FROM engines e
    WHERE NOT EXISTS (SELECT 1 FROM kv_groups g WHERE g.engine = e.engine)
),
lists AS (
    -- ARRAY_POSITION of an absent id is NULL in DuckDB and 0 in Spark: 0 on both
    SELECT g.engine, g.step, g.req_id, g.grp, k.kind, g.start,
           CAST(CARDINALITY(g.ids) AS BIGINT) AS n,
           COALESCE(ARRAY_POSITION(LIST_REVERSE(g.ids), 0), 0) AS from_end,
           CASE WHEN k.release_chunk IS NULL OR k.kind = 'mamba' THEN 0
                ELSE (GREATEST(g.num_computed_tokens - k.release_offset, 0) // k.release_chunk
                      * k.release_chunk) // k.block_size END AS covered_from
    FROM group_grants g
    JOIN groups_ k ON k.engine = g.engine AND k.grp = g.grp
    WHERE g.ids IS NOT NULL AND CARDINALITY(g.ids) > 0 AND k.block_size > 0
      AND k.kind IN ('full', 'sliding_window', 'chunked_local', 'mamba')
),
nulls AS (
    SELECT engine, step, req_id, grp, kind, from_end, start + n - from_end AS tpos, covered_from
    FROM lists
    WHERE from_end > 0
),
mamba_starts AS (
    -- a Mamba table set whole with a hit: whether a real block sits at the state's position
    -- (a real id appears once in a table, so ARRAY_POSITION finds its place; the nulls that
    -- pad the table before and after the state cannot be told apart that way)
    SELECT engine, step, req_id, grp, n, read_pos,
           SUM(CASE WHEN block_id <> 0 AND ARRAY_POSITION(ids, block_id) - 1 = read_pos
                    THEN 1 ELSE 0 END) AS at_read
    FROM (SELECT g.engine, g.step, g.req_id, g.grp, g.ids,
                 CAST(CARDINALITY(g.ids) AS BIGINT) AS n,
                 (g.num_computed_tokens + k.block_size - 1) // k.block_size - 1 AS read_pos,
                 UNNEST(g.ids) AS block_id
          FROM group_grants g
          JOIN groups_ k ON k.engine = g.engine AND k.grp = g.grp
          WHERE k.kind = 'mamba' AND k.block_size > 0 AND g.kind IN ('new', 'resumed')
            AND g.num_computed_tokens > 0 AND g.ids IS NOT NULL) u
    GROUP BY engine, step, req_id, grp, n, read_pos
    UNION ALL
    -- an empty table has nothing to unnest: no block at the state's position either
    SELECT g.engine, g.step, g.req_id, g.grp, CAST(0 AS BIGINT) AS n,
           (g.num_computed_tokens + k.block_size - 1) // k.block_size - 1 AS read_pos,
           CAST(0 AS BIGINT) AS at_read
    FROM group_grants g
    JOIN groups_ k ON k.engine = g.engine AND k.grp = g.grp
    WHERE k.kind = 'mamba' AND k.block_size > 0 AND g.kind IN ('new', 'resumed')
      AND g.num_computed_tokens > 0 AND g.ids IS NOT NULL AND CARDINALITY(g.ids) = 0
)
SELECT engine, step, req_id,
       'KV cache group ' || CAST(grp AS VARCHAR) || ' (' || kind || '): the null block at table '
       || 'position ' || CAST(tpos AS VARCHAR)
       || CASE WHEN kind = 'mamba' THEN ', where the step writes its state'
               ELSE ', which its attention reads (positions from '
                    || CAST(covered_from AS VARCHAR) || ' on)' END AS details
FROM nulls
WHERE (kind = 'mamba' AND from_end = 1) OR (kind <> 'mamba' AND tpos >= covered_from)
UNION ALL
SELECT engine, step, req_id,
       'KV cache group ' || CAST(grp AS VARCHAR) || ' (mamba): '
       || CASE WHEN n <= read_pos THEN 'no block at table position ' || CAST(read_pos AS VARCHAR)
                    || ' (' || CAST(n AS VARCHAR) || ' in the table)'
               ELSE 'the null block at table position ' || CAST(read_pos AS VARCHAR) END
       || ', the state its computed tokens left, which the step starts from' AS details
FROM mamba_starts
WHERE n <= read_pos OR at_read = 0
