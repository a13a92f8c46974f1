-- id: structured.unflagged
-- severity: warning
-- title: has_structured_output_requests false in a step where a structured-output request samples
-- why: The scheduler sets the flag (on every engine) when a scheduled request uses structured
--      output and is not a prefill chunk. An async worker with a drafter reads it: when it is
--      false (and no penalties need the outputs), the drafts are not copied to the CPU, and
--      take_draft_token_ids hands the scheduler none to check against the grammar.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._update_after_schedule;
--            vllm/v1/worker/gpu_model_runner.py GPUModelRunner._copy_draft_token_ids_to_cpu /
--            take_draft_token_ids
-- needs: steps, scheduled, requests, instances, engines
-- columns: engine, step, req_id (NULL), details
-- note: only async engines with a drafter: elsewhere the worker never reads the flag (the
--       scheduler's own get_grammar_bitmask does, on every engine). A row samples when
--       num_computed_tokens + num_scheduled_tokens reaches the prompt plus num_output_tokens
--       (which counts async placeholders), the scheduler's is_prefill_chunk turned around.
WITH structured AS (
    SELECT i.engine, i.req_id, i.intro_step, i.next_intro_step, i.prompt_len
    FROM requests r
    JOIN engines e ON e.engine = r.engine
    JOIN instances i ON i.engine = r.engine AND i.req_id = r.req_id AND i.intro_step = r.step
    WHERE e.async_scheduling AND e.spec_method IS NOT NULL
      AND json_extract_string(r.sampling_params, '$.structured_outputs') IS NOT NULL
),
sampling AS (
    SELECT c.engine, c.step, c.req_id
    FROM scheduled c
    JOIN structured q ON q.engine = c.engine AND q.req_id = c.req_id
         AND c.step >= q.intro_step AND (q.next_intro_step IS NULL OR c.step < q.next_intro_step)
    WHERE c.num_scheduled_tokens IS NOT NULL AND c.num_computed_tokens IS NOT NULL
      AND c.num_computed_tokens + c.num_scheduled_tokens
          >= q.prompt_len + COALESCE(c.num_output_tokens, 0)
),
per_step AS (
    SELECT engine, step, COUNT(*) AS n, STRING_AGG(req_id, ', ' ORDER BY req_id) AS ids
    FROM sampling
    GROUP BY engine, step
)
SELECT s.engine, s.step, CAST(NULL AS VARCHAR) AS req_id,
       'flag false, ' || CAST(p.n AS VARCHAR) || ' structured-output request(s) sample: '
       || p.ids AS details
FROM steps s
JOIN per_step p ON p.engine = s.engine AND p.step = s.step
WHERE NOT s.has_structured_output_requests
