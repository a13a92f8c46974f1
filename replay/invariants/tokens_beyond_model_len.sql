-- id: tokens.beyond_model_len
-- severity: error
-- title: computed plus scheduled tokens run past max_model_len
-- why: Positions past max_model_len index beyond the rotary tables and the block table's width.
-- relies_on: vllm/v1/worker/block_table.py BlockTable (max_num_blocks_per_req)
-- needs: scheduled
-- columns: engine, step, req_id, details
WITH smallest AS (
    SELECT MIN(max_model_len) AS max_model_len FROM engines
),
long_ AS (
    -- a row too long for its engine is too long for the smallest limit: that filter comes
    -- before the join of every row with its engine (0.7 s at a million steps)
    SELECT s.engine, s.step, s.req_id, s.num_computed_tokens, s.num_scheduled_tokens
    FROM scheduled s
    JOIN smallest m ON s.num_computed_tokens + s.num_scheduled_tokens > m.max_model_len
    WHERE s.num_scheduled_tokens IS NOT NULL
)
SELECT s.engine, s.step, s.req_id,
       'num_computed_tokens ' || CAST(s.num_computed_tokens AS VARCHAR) || ' + scheduled '
       || CAST(s.num_scheduled_tokens AS VARCHAR) || ' > max_model_len '
       || CAST(e.max_model_len AS VARCHAR) AS details
FROM long_ s JOIN engines e ON e.engine = s.engine
WHERE e.max_model_len IS NOT NULL
  AND s.num_computed_tokens + s.num_scheduled_tokens > e.max_model_len
