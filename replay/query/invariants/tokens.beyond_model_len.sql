-- id: tokens.beyond_model_len
-- severity: error
-- title: computed plus scheduled tokens run past max_model_len
-- why: The worker's token buffer has max_model_len columns per request (InputBatch.token_ids_cpu)
--      and its block table cdiv(max_model_len, block_size) entries: positions past
--      max_model_len index beyond them and the rotary tables. A row that samples writes its token
--      at position num_computed_tokens + scheduled, and the runner asserts that it stays below
--      max_model_len ("Sampled token IDs exceed the max model length"): with drafts, whenever
--      they are all accepted.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_inputs (token_indices),
--            _bookkeeping_sync (end_idx <= max_model_len); vllm/v1/worker/block_table.py
--            BlockTable (max_num_blocks_per_req); vllm/v1/core/sched/scheduler.py
--            Scheduler.schedule (caps computed + scheduled at max_model_len - 1)
-- needs: scheduled, step_totals, engines, instances, requests
-- columns: engine, step, req_id, details
-- note: a row of a request introduced with sampling (no pooling_params) may reach
--       max_model_len - 1; the scheduler keeps that slot for the sampled token
--       (num_sampled_tokens_per_step) and the input processor turns away a prompt of
--       max_model_len. A pooling request samples nothing and may reach max_model_len, and so may
--       a row whose introduction the trace lacks (attached mid-stream): not known to sample.
--       Diffusion models (Model Runner V2 only) reserve no sampled slot and are not told apart.
WITH long_steps AS (
    -- only a step whose longest row (step_totals) reaches its engine's limit has rows to
    -- report: the others' rows are never read
    SELECT p.engine, p.step
    FROM step_totals p JOIN engines e ON e.engine = p.engine
    WHERE e.max_model_len IS NOT NULL AND p.most_tokens >= e.max_model_len
),
rows_ AS (
    SELECT s.engine, s.step, s.req_id, s.num_computed_tokens, s.num_scheduled_tokens,
           e.max_model_len
    FROM scheduled s
    JOIN long_steps l ON l.engine = s.engine AND l.step = s.step
    JOIN engines e ON e.engine = s.engine
    WHERE s.num_scheduled_tokens IS NOT NULL
      AND s.num_computed_tokens + s.num_scheduled_tokens >= e.max_model_len
),
sampling AS (
    -- the rows at the limit of an instance introduced with sampling: it samples a token there
    SELECT DISTINCT w.engine, w.step, w.req_id
    FROM rows_ w
    JOIN instances i ON i.engine = w.engine AND i.req_id = w.req_id AND i.intro_step <= w.step
         AND (i.next_intro_step IS NULL OR w.step < i.next_intro_step)
    JOIN requests r ON r.engine = i.engine AND r.req_id = i.req_id AND r.step = i.intro_step
    WHERE r.pooling_params IS NULL
      AND w.num_computed_tokens + w.num_scheduled_tokens = w.max_model_len
)
SELECT w.engine, w.step, w.req_id,
       'num_computed_tokens ' || CAST(w.num_computed_tokens AS VARCHAR) || ' + scheduled '
       || CAST(w.num_scheduled_tokens AS VARCHAR)
       || CASE WHEN w.num_computed_tokens + w.num_scheduled_tokens > w.max_model_len
               THEN ' > max_model_len ' || CAST(w.max_model_len AS VARCHAR)
               ELSE ' = max_model_len ' || CAST(w.max_model_len AS VARCHAR)
                    || ', no position left for the token it samples' END AS details
FROM rows_ w
LEFT JOIN sampling g ON g.engine = w.engine AND g.step = w.step AND g.req_id = w.req_id
WHERE w.num_computed_tokens + w.num_scheduled_tokens > w.max_model_len OR g.req_id IS NOT NULL
