-- id: blocks.table_short
-- severity: error
-- title: a request's block table is too short for its computed plus scheduled tokens
-- why: The worker maps every token position to a slot through the block table; positions past
--      its end read slot ids from stale table entries and write KV into other requests' blocks.
-- relies_on: vllm/v1/worker/block_table.py BlockTable.compute_slot_mapping
-- needs: scheduled, engines
-- columns: engine, step, req_id, details
-- note: a new request's block_ids and a resumed request's new_block_ids are the whole table;
--       a cached request's new_block_ids are appended. Per KV cache group the table length is
--       the blocks of all groups divided by the number of groups.
WITH rows_ AS (
    SELECT engine, step, req_id, kind, num_computed_tokens, num_scheduled_tokens,
           CASE WHEN new_block_ids IS NULL OR CARDINALITY(new_block_ids) = 0 THEN 0
                ELSE CARDINALITY(FLATTEN(new_block_ids)) / CARDINALITY(new_block_ids) END AS added,
           SUM(CASE WHEN kind IN ('new', 'resumed') THEN 1 ELSE 0 END) OVER (
               PARTITION BY engine, req_id ORDER BY step
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS segment
    FROM scheduled
    WHERE kind IS NOT NULL AND num_scheduled_tokens IS NOT NULL
),
tables_ AS (
    SELECT engine, step, req_id, kind, num_computed_tokens, num_scheduled_tokens, segment,
           SUM(added) OVER (
               PARTITION BY engine, req_id, segment ORDER BY step
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS table_len
    FROM rows_
)
SELECT t.engine, t.step, t.req_id,
       'block table of ' || CAST(t.table_len AS VARCHAR) || ' blocks ('
       || CAST(t.table_len * e.block_size AS VARCHAR) || ' slots) for '
       || CAST(t.num_computed_tokens + t.num_scheduled_tokens AS VARCHAR) || ' tokens' AS details
FROM tables_ t JOIN engines e ON e.engine = t.engine
WHERE t.segment > 0 AND e.block_size IS NOT NULL
  AND t.table_len * e.block_size < t.num_computed_tokens + t.num_scheduled_tokens
