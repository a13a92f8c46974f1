-- id: tokens.beyond_request
-- severity: error
-- title: computed plus scheduled tokens run past the request's own tokens
-- why: The worker has no token ids beyond prompt + outputs (+ drafts) to feed: it reads stale
--      or uninitialised slots of its token buffer.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_inputs (token_ids_cpu)
-- needs: scheduled, runs, run_ids
-- columns: engine, step, req_id, details
WITH rows_ AS (
    SELECT r.inst, r.step, r.kind, r.num_computed_tokens, r.num_scheduled_tokens,
           k.prompt_len + COALESCE(r.num_output_tokens, 0) + r.drafts AS known_tokens
    FROM runs r
    JOIN run_ids k ON k.inst = r.inst
    WHERE r.inst > 0 AND r.num_scheduled_tokens IS NOT NULL
)
SELECT k.engine, r.step, k.req_id,
       r.kind || ': num_computed_tokens ' || CAST(r.num_computed_tokens AS VARCHAR)
       || ' + scheduled ' || CAST(r.num_scheduled_tokens AS VARCHAR) || ' > '
       || CAST(r.known_tokens AS VARCHAR) || ' tokens (prompt + outputs + drafts)' AS details
FROM rows_ r
JOIN run_ids k ON k.inst = r.inst
WHERE r.num_computed_tokens + r.num_scheduled_tokens > r.known_tokens
