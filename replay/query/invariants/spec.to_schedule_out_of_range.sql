-- id: spec.to_schedule_out_of_range
-- severity: error
-- title: num_spec_tokens_to_schedule outside 0..num_speculative_tokens on an engine with a drafter
-- why: The worker's drafter proposes that many tokens per request into buffers sized for
--      num_speculative_tokens, and the async scheduler sends that many placeholders next step.
--      The scheduler sends num_speculative_tokens, or with dynamic speculative decoding a
--      lookup by batch size capped at it (0 allowed: a schedule may turn drafting off).
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner.propose_draft_token_ids;
--            vllm/v1/core/sched/scheduler.py Scheduler.schedule;
--            vllm/v1/spec_decode/dynamic/utils.py build_dynamic_sd_schedule_lookup
-- needs: steps, engines
-- columns: engine, step, req_id (NULL), details
-- note: engines without a drafter send 0 and their worker never reads it: not checked.
SELECT s.engine, s.step, CAST(NULL AS VARCHAR) AS req_id,
       'num_spec_tokens_to_schedule ' || CAST(s.num_spec_tokens_to_schedule AS VARCHAR)
       || ' outside 0..' || CAST(e.num_speculative_tokens AS VARCHAR) AS details
FROM steps s
JOIN engines e ON e.engine = s.engine
WHERE e.spec_method IS NOT NULL AND e.num_speculative_tokens IS NOT NULL
  AND s.num_spec_tokens_to_schedule IS NOT NULL
  AND (s.num_spec_tokens_to_schedule < 0
       OR s.num_spec_tokens_to_schedule > e.num_speculative_tokens)
