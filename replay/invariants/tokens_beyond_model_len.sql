-- id: tokens.beyond_model_len
-- severity: error
-- title: computed plus scheduled tokens run past max_model_len
-- why: Positions past max_model_len index beyond the rotary tables and the block table's width.
-- relies_on: vllm/v1/worker/block_table.py BlockTable (max_num_blocks_per_req)
-- needs: scheduled
-- columns: engine, step, req_id, details
SELECT s.engine, s.step, s.req_id,
       'num_computed_tokens ' || CAST(s.num_computed_tokens AS VARCHAR) || ' + scheduled '
       || CAST(s.num_scheduled_tokens AS VARCHAR) || ' > max_model_len '
       || CAST(e.max_model_len AS VARCHAR) AS details
FROM scheduled s JOIN engines e ON e.engine = s.engine
WHERE e.max_model_len IS NOT NULL AND s.num_scheduled_tokens IS NOT NULL
  AND s.num_computed_tokens + s.num_scheduled_tokens > e.max_model_len
