-- id: blocks.repeated_in_grant
-- severity: error
-- title: the same block twice in one request's new blocks of one step
-- why: The worker copies new_block_ids into the request's block table as they are
--      (BlockTable.append_row): two table entries on one block map two ranges of positions to
--      the same slots, so the later tokens overwrite the earlier ones' KV (silently wrong tokens).
-- relies_on: vllm/v1/worker/block_table.py BlockTable.append_row / add_row;
--      vllm/v1/core/block_pool.py BlockPool.get_new_blocks
-- needs: scheduled, grants
-- columns: engine, step, req_id, details
-- note: block 0 is the null block (BlockPool.null_block), which a sliding-window or Mamba group
--       repeats by design: not compared. blocks.double_owner compares a request with itself
--       only across steps.
WITH repeats AS (
    -- no unnesting: only the rows with a repeat, a null block's included, are taken apart
    -- below. The CASE keeps LIST_DISTINCT, costly per row, off the rows of one or two blocks
    -- (most of a decoding trace's): behind a plain AND DuckDB ran it on every row
    SELECT engine, step, req_id, block_ids
    FROM grants
    WHERE kind IS NOT NULL AND block_ids IS NOT NULL
      AND CASE WHEN CARDINALITY(block_ids) < 2 THEN FALSE
               WHEN CARDINALITY(block_ids) = 2 THEN block_ids[1] = block_ids[2]
               ELSE CARDINALITY(LIST_DISTINCT(block_ids)) < CARDINALITY(block_ids) END
),
twice AS (
    SELECT engine, step, req_id, block_id, COUNT(*) AS n
    FROM (SELECT engine, step, req_id, UNNEST(block_ids) AS block_id FROM repeats) b
    WHERE block_id <> 0
    GROUP BY engine, step, req_id, block_id
    HAVING COUNT(*) > 1
)
SELECT engine, step, req_id,
       CAST(COUNT(*) AS VARCHAR) || ' block(s) given more than once (e.g. block '
       || CAST(MIN(block_id) AS VARCHAR) || ', ' || CAST(ARG_MIN(n, block_id) AS VARCHAR)
       || ' times)' AS details
FROM twice
GROUP BY engine, step, req_id
