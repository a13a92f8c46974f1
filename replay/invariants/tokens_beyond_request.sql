-- id: tokens.beyond_request
-- severity: error
-- title: computed plus scheduled tokens run past the request's own tokens
-- why: The worker has no token ids beyond prompt + outputs (+ drafts) to feed: it reads stale
--      or uninitialised slots of its token buffer.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_inputs (token_ids_cpu)
-- needs: scheduled, requests
-- columns: engine, step, req_id, details
WITH intro AS (
    SELECT engine, req_id, step AS intro_step, prompt_len,
           LEAD(step) OVER (PARTITION BY engine, req_id ORDER BY step) AS next_intro_step
    FROM requests
),
rows_ AS (
    SELECT s.engine, s.step, s.req_id, s.kind, s.num_computed_tokens, s.num_scheduled_tokens,
           i.prompt_len + COALESCE(s.num_output_tokens, 0)
           + COALESCE(CARDINALITY(s.spec_token_ids), 0) AS known_tokens
    FROM scheduled s
    JOIN intro i ON i.engine = s.engine AND i.req_id = s.req_id
    WHERE s.step >= i.intro_step AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
      AND s.kind IS NOT NULL AND s.num_scheduled_tokens IS NOT NULL
)
SELECT engine, step, req_id,
       kind || ': num_computed_tokens ' || CAST(num_computed_tokens AS VARCHAR) || ' + scheduled '
       || CAST(num_scheduled_tokens AS VARCHAR) || ' > ' || CAST(known_tokens AS VARCHAR)
       || ' tokens (prompt + outputs + drafts)' AS details
FROM rows_
WHERE num_computed_tokens + num_scheduled_tokens > known_tokens
