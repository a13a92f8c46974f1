-- id: spec.beyond_configured
-- severity: error
-- title: more draft tokens for a request than the engine's num_speculative_tokens
-- why: The worker's draft buffers have num_speculative_tokens columns: under async scheduling
--      it finds a row's previous drafts at row * num_speculative_tokens, so a longer list reads
--      the next request's drafts as inputs; a uniform decode batch is 1 + that many tokens.
--      The scheduler schedules at most num_spec_tokens_to_schedule drafts, which never
--      exceeds it.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_input_ids;
--            vllm/v1/core/sched/scheduler.py Scheduler.schedule
-- needs: scheduled, drafts, engines
-- columns: engine, step, req_id, details
SELECT d.engine, d.step, d.req_id,
       CAST(CARDINALITY(d.spec_token_ids) AS VARCHAR) || ' drafts > num_speculative_tokens '
       || CAST(e.num_speculative_tokens AS VARCHAR) AS details
FROM drafts d
JOIN engines e ON e.engine = d.engine
WHERE e.spec_method IS NOT NULL AND e.num_speculative_tokens IS NOT NULL
  AND CARDINALITY(d.spec_token_ids) > e.num_speculative_tokens
