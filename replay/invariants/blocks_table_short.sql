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
WITH alloc AS (
    SELECT engine, step, req_id, kind,
           CARDINALITY(FLATTEN(new_block_ids)) / CARDINALITY(new_block_ids) AS added
    FROM scheduled
    WHERE kind IS NOT NULL AND new_block_ids IS NOT NULL AND CARDINALITY(new_block_ids) > 0
),
segmented AS (
    SELECT engine, step, req_id, kind, added,
           SUM(CASE WHEN kind IN ('new', 'resumed') THEN 1 ELSE 0 END) OVER (
               PARTITION BY engine, req_id ORDER BY step
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS segment,
           LEAD(step) OVER (PARTITION BY engine, req_id ORDER BY step) AS next_alloc
    FROM alloc
),
tables_ AS (
    -- only the (few) rows that change a table are windowed; every row then finds its table
    SELECT engine, step, req_id, segment, next_alloc,
           SUM(added) OVER (
               PARTITION BY engine, req_id, segment ORDER BY step
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS table_len
    FROM segmented
    WHERE segment > 0
)
SELECT s.engine, s.step, s.req_id,
       'block table of ' || CAST(t.table_len AS VARCHAR) || ' blocks ('
       || CAST(t.table_len * e.block_size AS VARCHAR) || ' slots) for '
       || CAST(s.num_computed_tokens + s.num_scheduled_tokens AS VARCHAR) || ' tokens' AS details
FROM scheduled s
JOIN tables_ t ON t.engine = s.engine AND t.req_id = s.req_id AND s.step >= t.step
     AND (t.next_alloc IS NULL OR s.step < t.next_alloc)
JOIN engines e ON e.engine = s.engine
WHERE s.kind IS NOT NULL AND s.num_scheduled_tokens IS NOT NULL AND e.block_size IS NOT NULL
  AND t.table_len * e.block_size < s.num_computed_tokens + s.num_scheduled_tokens
