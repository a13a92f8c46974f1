-- id: blocks.zeroed_held
-- severity: error
-- title: a block is zeroed while a live request that got it in an earlier step holds it
-- why: The worker zeroes new_block_ids_to_zero in place at the start of the step, before the
--      forward pass: a block a running request has already filled loses its KV, and from then on
--      that request attends to zeros (silently wrong tokens, no error anywhere).
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states / _zero_block_ids;
--      vllm/v1/core/single_type_kv_cache_manager.py SingleTypeKVCacheManager.allocate_new_blocks;
--      vllm/v1/core/kv_cache_manager.py KVCacheManager.take_new_block_ids
-- needs: steps, scheduled, grants, block_holds, window_releases, preempted, finish_events
-- columns: engine, step, req_id, details
-- note: the scheduler lists a block when get_new_blocks takes it off the free queue (no holder
--       left), and drains the list once per schedule(): prefix-cache hits are never listed, so
--       only the blocks granted in that step are, and blocks freed in it (a request preempted
--       in that step, whose hold ends there as in blocks.double_owner, may have been given them
--       first, and another request may get them again). A request's own grant in the step
--       (a new or resumed request's whole table, a running one's appended blocks) is what the
--       list is for. Hold spans are blocks.double_owner's: from a grant until the holder's
--       preemption or the step after its finish event. Block 0 is the null block
--       (BlockPool.null_block), whose KV is meant to be zeros: not compared. A waiting request
--       whose connector load failed has its blocks listed again (record_blocks_for_zeroing);
--       no grant shows it holding them before it is scheduled, so that is not reported. A
--       sliding-window, chunked-local or Mamba group's block is held until its window passes
--       it (`window_releases`), as in blocks.double_owner: a Mamba group's new state block is
--       zeroed, and is often one another request's window has just left behind.
WITH zeroed AS (
    SELECT DISTINCT engine, step, block_id
    FROM (SELECT engine, step, UNNEST(new_block_ids_to_zero) AS block_id
          FROM steps
          WHERE new_block_ids_to_zero IS NOT NULL) z
    WHERE block_id <> 0
),
overlapping AS (
    -- blocks that ever had two holders at once (prefix sharing): for the others the previous
    -- hold's end is the latest of all earlier ones
    SELECT DISTINCT engine, block_id FROM block_holds WHERE prev_end > step
),
suspects AS (
    -- a block zeroed in the step it is handed out, its previous holder gone by then, zeroes
    -- nobody's KV: only the other zeroings are swept below (in a Mamba engine's trace, where
    -- every newly allocated block is zeroed, that leaves almost none)
    SELECT z.engine, z.step, z.block_id
    FROM zeroed z
    WHERE NOT EXISTS (
        SELECT 1 FROM block_holds h
        WHERE h.engine = z.engine AND h.block_id = z.block_id AND h.step = z.step
          AND (h.prev_end IS NULL OR h.prev_end <= z.step))
       OR EXISTS (SELECT 1 FROM overlapping o
                  WHERE o.engine = z.engine AND o.block_id = z.block_id)
),
zblocks AS (
    SELECT DISTINCT engine, block_id FROM suspects
),
holds AS (
    -- the holds of those blocks: none at all where the cache needs no zeroing (the list is
    -- NULL)
    SELECT h.engine, h.req_id, h.step, h.block_id, h.end_step
    FROM block_holds h
    JOIN zblocks z ON z.engine = h.engine AND z.block_id = h.block_id
),
events AS (
    SELECT engine, block_id, step, COALESCE(end_step, 9223372036854775807) AS end_step,
           0 AS zeroing
    FROM holds
    UNION ALL
    SELECT engine, block_id, step, CAST(NULL AS BIGINT) AS end_step, 1 AS zeroing
    FROM suspects
),
swept AS (
    -- per block, in step order: until when the holders from earlier steps keep it (one sort,
    -- instead of joining each zeroing with every earlier holder of its block)
    SELECT engine, block_id, step, zeroing,
           MAX(end_step) OVER (PARTITION BY engine, block_id ORDER BY step
                               RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS held_until
    FROM events
),
holders AS (
    -- who holds it, looked up for the zeroings that hit a holder alone
    SELECT s.engine, s.step, h.req_id, s.block_id, h.step AS since
    FROM swept s
    JOIN holds h ON h.engine = s.engine AND h.block_id = s.block_id AND h.step < s.step
         AND (h.end_step IS NULL OR h.end_step > s.step)
    WHERE s.zeroing = 1 AND s.held_until > s.step
)
SELECT engine, step, req_id,
       CAST(COUNT(DISTINCT block_id) AS VARCHAR) || ' block(s) it holds zeroed (e.g. '
       || CAST(MIN(block_id) AS VARCHAR) || '), held since step ' || CAST(MIN(since) AS VARCHAR)
       AS details
FROM holders
GROUP BY engine, step, req_id
