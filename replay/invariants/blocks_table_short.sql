-- id: blocks.table_short
-- severity: error
-- title: a request's block table is too short for its computed plus scheduled tokens
-- why: The worker maps every token position to a slot through the block table; positions past
--      its end read slot ids from stale table entries and write KV into other requests' blocks.
-- relies_on: vllm/v1/worker/block_table.py BlockTable.compute_slot_mapping
-- needs: scheduled, runs, run_ids, engines
-- columns: engine, step, req_id, details
-- note: a new request's block_ids and a resumed request's new_block_ids are the whole table;
--       a cached request's new_block_ids are appended. Per KV cache group the table length is
--       the blocks of all groups divided by the number of groups.
WITH tables_ AS (
    -- the table after each row: every block the instance was given since its introduction,
    -- or since its latest resumption (whose blocks are the whole table)
    SELECT r.inst, r.step, r.kind, r.num_computed_tokens, r.num_scheduled_tokens,
           r.cum_blocks - COALESCE(b.cum_blocks - b.blocks, 0) AS table_len
    FROM runs r
    LEFT JOIN runs b ON b.inst = r.inst AND b.step = r.last_resume_step AND b.kind = 'resumed'
    WHERE r.num_scheduled_tokens IS NOT NULL
      AND (r.inst > 0 OR r.last_resume_step IS NOT NULL)  -- an orphan's table is unknown
),
short_anywhere AS (
    -- too short even at the smallest block size of any engine: a superset of the findings,
    -- found before any row is joined with its names
    SELECT inst, step, num_computed_tokens, num_scheduled_tokens, table_len
    FROM tables_
    WHERE table_len * (SELECT MIN(block_size) FROM engines)
          < num_computed_tokens + num_scheduled_tokens
)
SELECT k.engine, t.step, k.req_id,
       'block table of ' || CAST(t.table_len AS VARCHAR) || ' blocks ('
       || CAST(t.table_len * e.block_size AS VARCHAR) || ' slots) for '
       || CAST(t.num_computed_tokens + t.num_scheduled_tokens AS VARCHAR) || ' tokens' AS details
FROM short_anywhere t
JOIN run_ids k ON k.inst = t.inst
JOIN engines e ON e.engine = k.engine
WHERE e.block_size IS NOT NULL
  AND t.table_len * e.block_size < t.num_computed_tokens + t.num_scheduled_tokens
