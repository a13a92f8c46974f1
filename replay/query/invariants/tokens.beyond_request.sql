-- id: tokens.beyond_request
-- severity: error
-- title: computed plus scheduled tokens run past the request's own tokens
-- why: The worker has no token ids beyond prompt + outputs (+ drafts) to feed: it reads stale
--      or uninitialised slots of its token buffer.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_inputs (token_ids_cpu)
-- needs: scheduled, run_groups, windowed_runs, run_ids
-- columns: engine, step, req_id, details
WITH suspects AS (
    -- A plain id's rows have no drafts, so one of them passes prompt + outputs only if the id's
    -- largest computed + scheduled - outputs does: only those ids are read row by row (the rows
    -- of every id through `runs` cost far more).
    SELECT g.engine, g.req_id, g.inst
    FROM run_groups g
    JOIN run_ids k ON k.inst = g.inst
    WHERE g.plain AND g.inst > 0 AND g.most_ahead > k.prompt_len
),
listed AS (
    SELECT g.inst, s.step, s.kind, CAST(s.num_computed_tokens AS INTEGER) AS num_computed_tokens,
           CAST(s.num_scheduled_tokens AS INTEGER) AS num_scheduled_tokens,
           CAST(s.num_output_tokens AS INTEGER) AS num_output_tokens, 0 AS drafts
    FROM scheduled s
    JOIN suspects g ON g.engine = s.engine AND g.req_id = s.req_id
    WHERE s.kind IS NOT NULL
    UNION ALL
    SELECT inst, step, kind, num_computed_tokens, num_scheduled_tokens, num_output_tokens, drafts
    FROM windowed_runs
),
rows_ AS (
    SELECT r.inst, r.step, r.kind, r.num_computed_tokens, r.num_scheduled_tokens,
           k.prompt_len + COALESCE(r.num_output_tokens, 0) + r.drafts AS known_tokens
    FROM listed r
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
