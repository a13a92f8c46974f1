-- id: tokens.new_token_ids_length
-- severity: error
-- title: pipeline parallel: cached requests' new_token_ids of the wrong length
-- why: Without async scheduling the scheduler sends the stages before the last one the tokens
--      they cannot sample: one list per cached request, each the request's tokens from
--      num_computed_tokens on, as many as its scheduled tokens without drafts. The worker reads
--      new_token_ids[i] whenever the list is not empty: too few lists is an IndexError; an empty
--      list on a sync engine leaves those stages without the sampled tokens, and a list of the
--      wrong length drops or invents output tokens in their inputs (silent).
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._make_cached_request_data (use_pp);
--            vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states (not is_last_rank)
-- needs: steps, scheduled, engines
-- columns: engine, step, req_id, details
-- note: engines with pipeline_parallel_size > 1 only (the worker reads none otherwise). Async
--       scheduling sends no lists (the tokens go by GPU broadcast), so 0 is right there too. The
--       recorder pads a short list with NULLs (steps.cached_new_token_ids_len keeps its length),
--       so a row's own length is checked only in a step that sent one list per request.
WITH sent AS (
    SELECT s.engine, s.step, s.num_cached, s.cached_new_token_ids_len AS n, e.async_scheduling
    FROM steps s
    JOIN engines e ON e.engine = s.engine
    WHERE e.pipeline_parallel_size > 1 AND s.cached_new_token_ids_len IS NOT NULL
      AND s.num_cached IS NOT NULL
)
SELECT engine, step, CAST(NULL AS VARCHAR) AS req_id,
       CAST(n AS VARCHAR) || ' new_token_ids lists for ' || CAST(num_cached AS VARCHAR)
       || ' cached requests' AS details
FROM sent
WHERE n <> num_cached AND (n <> 0 OR NOT async_scheduling)
UNION ALL
SELECT c.engine, c.step, c.req_id,
       CAST(CARDINALITY(c.new_token_ids) AS VARCHAR) || ' new tokens for '
       || CAST(c.num_scheduled_tokens - CASE WHEN c.spec_token_ids IS NULL THEN 0
                                             ELSE CARDINALITY(c.spec_token_ids) END AS VARCHAR)
       || ' scheduled without drafts' AS details
FROM scheduled c
JOIN sent t ON t.engine = c.engine AND t.step = c.step
WHERE t.n = t.num_cached AND t.n > 0 AND c.kind IN ('cached', 'resumed')
  AND c.new_token_ids IS NOT NULL AND c.num_scheduled_tokens IS NOT NULL
  AND CARDINALITY(c.new_token_ids) <> c.num_scheduled_tokens
      - CASE WHEN c.spec_token_ids IS NULL THEN 0 ELSE CARDINALITY(c.spec_token_ids) END
