-- id: tokens.beyond_model_len
-- severity: error
-- title: computed plus scheduled tokens run past max_model_len
-- why: Positions past max_model_len index beyond the rotary tables and the block table's width.
-- relies_on: vllm/v1/worker/block_table.py BlockTable (max_num_blocks_per_req)
-- needs: scheduled, step_totals, engines
-- columns: engine, step, req_id, details
WITH long_steps AS (
    -- only a step whose longest row (step_totals) passes its engine's limit has rows to report:
    -- the others' rows are never read
    SELECT p.engine, p.step
    FROM step_totals p JOIN engines e ON e.engine = p.engine
    WHERE e.max_model_len IS NOT NULL AND p.most_tokens > e.max_model_len
)
SELECT s.engine, s.step, s.req_id,
       'num_computed_tokens ' || CAST(s.num_computed_tokens AS VARCHAR) || ' + scheduled '
       || CAST(s.num_scheduled_tokens AS VARCHAR) || ' > max_model_len '
       || CAST(e.max_model_len AS VARCHAR) AS details
FROM scheduled s
JOIN long_steps l ON l.engine = s.engine AND l.step = s.step
JOIN engines e ON e.engine = s.engine
WHERE s.num_scheduled_tokens IS NOT NULL
  AND s.num_computed_tokens + s.num_scheduled_tokens > e.max_model_len
