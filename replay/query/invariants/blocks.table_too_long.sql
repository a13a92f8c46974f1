-- id: blocks.table_too_long
-- severity: error
-- title: a request's block table is longer than max_model_len needs
-- why: The worker's block table has one row per request, cdiv(max_model_len, block_size)
--      entries wide (KVCacheSpec.max_num_blocks_per_req), aligned up to 128 tokens
--      (get_block_table_width); appending past the row's end raises ValueError in the numpy
--      assignment of BlockTable.append_row, and the scheduler never allocates past
--      max_model_len (KVCacheManager.allocate_slots caps the tokens that need a slot).
-- relies_on: vllm/v1/worker/block_table.py BlockTable.append_row, get_block_table_width;
--      vllm/v1/core/kv_cache_manager.py KVCacheManager.allocate_slots
-- needs: scheduled, grants, engines
-- columns: engine, step, req_id, details
-- note: reported past cdiv(max_model_len, block_size), the contract, not only past the aligned
--       width that crashes. A new or resumed request's blocks are the whole table, a cached
--       request's are appended; per KV cache group a table's length is the blocks of all groups
--       divided by the number of groups (the `grants` view's `blocks`). The first step of each
--       table past the width is reported. An orphan's table (attached mid-stream) is unknown
--       until it is resumed. Encoder-decoder engines size the row by max(max_model_len,
--       max_encoder_len), which the manifest lacks.
WITH widths AS (
    SELECT engine, block_size, max_model_len,
           (max_model_len + block_size - 1) // block_size AS width
    FROM engines
    WHERE block_size IS NOT NULL AND block_size > 0 AND max_model_len IS NOT NULL
),
candidates AS (
    -- a table is never longer than all the blocks its id was given: only the ids given more
    -- than a row's width in all are walked (in a clean trace, long requests resumed often)
    SELECT s.engine, s.req_id
    FROM (SELECT engine, req_id, SUM(blocks) AS given
          FROM grants
          WHERE kind IS NOT NULL
          GROUP BY engine, req_id) s
    JOIN widths w ON w.engine = s.engine
    WHERE s.given > w.width
),
walked AS (
    SELECT g.engine, g.req_id, g.step, g.kind, g.pos, g.blocks,
           SUM(CASE WHEN g.kind IN ('new', 'resumed') THEN 1 ELSE 0 END) OVER (
               PARTITION BY g.engine, g.req_id ORDER BY g.step, g.kind, g.pos
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS segment
    FROM grants g
    JOIN candidates c ON c.engine = g.engine AND c.req_id = g.req_id
    WHERE g.kind IS NOT NULL
),
tables_ AS (
    SELECT engine, req_id, step, segment,
           SUM(blocks) OVER (PARTITION BY engine, req_id, segment ORDER BY step, kind, pos
                             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS table_len
    FROM walked
    WHERE segment > 0
),
too_long AS (
    SELECT t.engine, t.req_id, t.segment, MIN(t.step) AS step, MIN(t.table_len) AS table_len
    FROM tables_ t
    JOIN widths w ON w.engine = t.engine
    WHERE t.table_len > w.width
    GROUP BY t.engine, t.req_id, t.segment
)
SELECT l.engine, l.step, l.req_id,
       'block table of ' || CAST(l.table_len AS VARCHAR) || ' blocks, past the '
       || CAST(w.width AS VARCHAR) || ' that max_model_len ' || CAST(w.max_model_len AS VARCHAR)
       || ' needs at ' || CAST(w.block_size AS VARCHAR) || ' tokens a block' AS details
FROM too_long l
JOIN widths w ON w.engine = l.engine
