-- id: blocks.table_short
-- severity: error
-- title: a request's block table is too short for its computed plus scheduled tokens
-- why: The worker maps every token position to a slot through the block table; positions past
--      its end read slot ids from stale table entries and write KV into other requests' blocks.
-- relies_on: vllm/v1/worker/block_table.py BlockTable.compute_slot_mapping
-- needs: scheduled, grants, runs, run_groups, windowed_runs, run_ids, engines
-- columns: engine, step, req_id, details
-- note: a new request's block_ids and a resumed request's new_block_ids are the whole table;
--       a cached request's new_block_ids are appended. Per KV cache group the table length is
--       the blocks of all groups divided by the number of groups. Within the steps between two
--       changes of a table, a request's tokens only grow (computed.progress reports where they do
--       not), so each table is compared with its first and last row; the first short row of a
--       short table is then looked up. An orphan's table (attached mid-stream) is unknown until
--       it is resumed.
WITH grant_fit AS (
    -- Per id: whether each of its `grants` rows gave exactly the blocks its tokens called for
    -- (a new or resumed row, whose blocks are the whole table: ceil(tokens / block size); a
    -- cached row: the blocks its tokens crossed into, ceil(tokens / block size) minus
    -- ceil(num_computed_tokens / block size)), and all the blocks they gave.
    SELECT r.engine, r.req_id, SUM(r.blocks) AS blocks,
           MIN(CASE WHEN r.blocks
                         = (r.num_computed_tokens + r.num_scheduled_tokens + e.block_size - 1)
                           // e.block_size
                           - CASE WHEN r.kind IN ('new', 'resumed') THEN 0
                                  ELSE (r.num_computed_tokens + e.block_size - 1) // e.block_size
                             END
                    THEN 1 ELSE 0 END) AS exact
    FROM grants r
    JOIN engines e ON e.engine = r.engine
    WHERE r.kind IS NOT NULL
    GROUP BY r.engine, r.req_id
),
plain_open AS (
    -- The plain ids (run_groups) whose first row is new or resumed, but those whose every grant
    -- was exact and whose blocks add up to ceil(last_end / block size). A plain id's rows each
    -- begin where the previous one ended, so over all its rows the blocks their tokens cross
    -- into add up to that; exact grants then leave none of them to the rows without a grant,
    -- and its table held ceil(tokens / block size) blocks in every step: never short. (The
    -- walk below sorted all their grants for no finding.)
    SELECT g.engine, g.req_id, g.inst, g.last_end
    FROM run_groups g
    JOIN engines e ON e.engine = g.engine
    LEFT JOIN grant_fit f ON f.engine = g.engine AND f.req_id = g.req_id
    WHERE g.plain AND g.first_kind IN ('new', 'resumed')
      AND (f.exact IS NULL OR f.exact = 0 OR e.block_size IS NULL
           OR f.blocks <> (g.last_end + e.block_size - 1) // e.block_size)
),
plain_changes AS (
    -- The other plain ids whose first row is new or resumed have one table each, reset at that
    -- row: its length at each change is the blocks handed out so far, and the table before the
    -- next change had to hold that change's num_computed_tokens (a plain id's rows each begin
    -- where the previous one ended). So their changes, taken from `grants`, need one window of
    -- three functions (cheaper than the general walk below).
    SELECT g.inst, r.step, r.blocks, r.num_computed_tokens + r.num_scheduled_tokens AS tokens,
           r.num_computed_tokens, g.last_end
    FROM grants r
    JOIN plain_open g ON g.engine = r.engine AND g.req_id = r.req_id
    WHERE r.kind IS NOT NULL AND (r.blocks > 0 OR r.kind IN ('new', 'resumed'))
),
plain_ends AS (
    SELECT inst, step, next_change, table_len,
           GREATEST(tokens, CASE WHEN next_change IS NULL THEN last_end ELSE next_computed END)
               AS most_tokens
    FROM (
        SELECT inst, step, tokens, last_end,
               SUM(blocks) OVER (PARTITION BY inst ORDER BY step
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS table_len,
               LEAD(step) OVER (PARTITION BY inst ORDER BY step) AS next_change,
               LEAD(num_computed_tokens) OVER (PARTITION BY inst ORDER BY step) AS next_computed
        FROM plain_changes
    ) w
),
changes AS (
    -- the other ids' rows that change a request's table: a new or resumed request's blocks are
    -- the whole table (a reset), a cached request's are appended (the row before each is where
    -- the previous table's last row is)
    SELECT inst, step, blocks, num_computed_tokens + num_scheduled_tokens AS tokens,
           prev_step, prev_end AS prev_tokens,
           CASE WHEN kind IN ('new', 'resumed') THEN 1 ELSE 0 END AS reset
    FROM windowed_runs
    WHERE blocks > 0 OR kind IN ('new', 'resumed')
),
walked AS (
    -- one sort per request in step order: the blocks and resets so far, the next change
    SELECT inst, step, tokens, blocks, reset,
           SUM(reset) OVER (PARTITION BY inst ORDER BY step
                            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS segment,
           SUM(blocks) OVER (PARTITION BY inst ORDER BY step
                             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS blocks_so_far,
           LEAD(step) OVER (PARTITION BY inst ORDER BY step) AS next_change,
           LEAD(prev_step) OVER (PARTITION BY inst ORDER BY step) AS end_step,
           LEAD(prev_tokens) OVER (PARTITION BY inst ORDER BY step) AS end_tokens
    FROM changes
),
bases AS (
    -- the blocks before each table's reset row
    SELECT inst, segment, MIN(CASE WHEN reset = 1 THEN blocks_so_far - blocks END) AS base
    FROM walked
    WHERE segment > 0
    GROUP BY inst, segment
),
tables_ AS (
    SELECT w.inst, w.step, w.tokens, w.segment, w.blocks_so_far - b.base AS table_len,
           w.next_change, w.end_step, w.end_tokens
    FROM walked w
    JOIN bases b ON b.inst = w.inst AND b.segment = w.segment
),
last_rows AS (
    SELECT inst, MAX(step) AS last_step,
           ARG_MAX(num_computed_tokens + num_scheduled_tokens, step) AS last_tokens
    FROM windowed_runs
    GROUP BY inst
),
ends AS (
    -- each table with the most tokens it had to hold: at its first row or its last one (the row
    -- before the next change, or the request's last row)
    SELECT t.inst, t.step, t.next_change, t.table_len,
           GREATEST(COALESCE(t.tokens, 0),
                    COALESCE(CASE WHEN t.next_change IS NULL THEN l.last_tokens
                                  WHEN t.end_step >= t.step THEN t.end_tokens END, 0))
               AS most_tokens
    FROM tables_ t
    JOIN last_rows l ON l.inst = t.inst
    WHERE t.segment > 0
    UNION ALL
    SELECT inst, step, next_change, table_len, most_tokens FROM plain_ends
),
smallest AS (
    SELECT MIN(block_size) AS block_size FROM engines
),
short_ AS (
    -- a table short for its engine's block size is short for the smallest one: that filter
    -- comes before the join with every table's name, which then joins only those rows
    SELECT e.inst, e.step, e.next_change, e.table_len, k.engine, k.req_id, en.block_size
    FROM ends e
    JOIN smallest m ON e.table_len * m.block_size < e.most_tokens
    JOIN run_ids k ON k.inst = e.inst
    JOIN engines en ON en.engine = k.engine
    WHERE en.block_size IS NOT NULL AND e.table_len * en.block_size < e.most_tokens
),
first_short AS (
    SELECT s.inst, s.engine, s.req_id, s.table_len, s.block_size, MIN(r.step) AS step
    FROM short_ s
    JOIN runs r ON r.inst = s.inst AND r.step >= s.step
         AND (s.next_change IS NULL OR r.step < s.next_change)
    WHERE s.table_len * s.block_size < r.num_computed_tokens + r.num_scheduled_tokens
    GROUP BY s.engine, s.req_id, s.table_len, s.block_size, s.inst, s.step
)
SELECT f.engine, f.step, f.req_id,
       'block table of ' || CAST(f.table_len AS VARCHAR) || ' blocks ('
       || CAST(f.table_len * f.block_size AS VARCHAR) || ' slots) for '
       || CAST(r.num_computed_tokens + r.num_scheduled_tokens AS VARCHAR) || ' tokens' AS details
FROM first_short f
JOIN runs r ON r.inst = f.inst AND r.step = f.step
