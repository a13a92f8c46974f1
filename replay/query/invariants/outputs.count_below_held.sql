-- id: outputs.count_below_held
-- severity: error
-- title: num_output_tokens is below the outputs the worker holds for the request
-- why: The worker takes a num_output_tokens below the outputs it has cached for a request as
--      outputs discarded (the path of a sync KV-load failure): it truncates output_token_ids and
--      num_tokens_no_spec to it. The tokens it drops are gone from the next input ids, the
--      penalties and the stop checks, and a replay reproduces the same wrong tokens (silent).
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states (del req_state.output_token_ids[num_output_tokens:]); vllm/v1/core/sched/scheduler.py Scheduler._make_cached_request_data (req.num_output_tokens)
-- needs: run_groups, run_ids, engines, scheduled, windowed_runs, model_outputs
-- columns: engine, step, req_id, details
-- note: sync engines only: under async scheduling the count includes placeholders for tokens
--       in flight and the worker's list optimistic drafts, and truncating it is the async
--       spec-decode correction. A sync step's update comes before the next schedule(), so the
--       worker holds what the request instance sampled in the steps before this row, or, after
--       a row that truncated it, that row's count plus what was sampled since: a shortfall is
--       reported where it starts, not again on the rows after it. Not reported: a cached row
--       whose num_computed_tokens falls below the previous row's end by more than its drafts
--       (what a KV-load failure does, discarding that step's sampled token on purpose), and on
--       pipeline-parallel engines a resumed row (batches overlap there, and a
--       reset_prefix_cache drops the output still in flight: drop_stale_output).
WITH suspects AS (
    -- A plain id decodes from its first output on: computed + scheduled is the prompt plus the
    -- outputs the worker holds, so a count below those puts its most_ahead past the prompt.
    -- Only those ids are read row by row, with the ids that are not plain.
    SELECT g.engine, g.req_id, g.inst
    FROM run_groups g
    JOIN run_ids k ON k.inst = g.inst
    JOIN engines e ON e.engine = g.engine
    WHERE g.plain AND g.inst > 0 AND g.most_ahead > k.prompt_len AND NOT e.async_scheduling
),
listed AS (
    SELECT g.inst, s.step, s.kind, CAST(s.num_computed_tokens AS INTEGER) AS num_computed_tokens,
           CAST(s.num_scheduled_tokens AS INTEGER) AS num_scheduled_tokens,
           CAST(s.num_output_tokens AS INTEGER) AS num_output_tokens, 0 AS drafts
    FROM scheduled s
    JOIN suspects g ON g.engine = s.engine AND g.req_id = s.req_id
    WHERE s.kind IS NOT NULL
    UNION ALL
    SELECT w.inst, w.step, w.kind, w.num_computed_tokens, w.num_scheduled_tokens,
           w.num_output_tokens, w.drafts
    FROM windowed_runs w
    JOIN run_ids k ON k.inst = w.inst
    JOIN engines e ON e.engine = k.engine
    WHERE w.inst > 0 AND NOT e.async_scheduling
),
events AS (
    -- the rows, and the instance's sampled tokens (a step's after its row)
    SELECT inst, step, 0 AS late, kind, num_computed_tokens, num_scheduled_tokens,
           num_output_tokens, drafts, 0 AS n
    FROM listed
    UNION ALL
    SELECT d.inst, m.step, 1 AS late, CAST(NULL AS VARCHAR) AS kind,
           CAST(NULL AS INTEGER) AS num_computed_tokens,
           CAST(NULL AS INTEGER) AS num_scheduled_tokens,
           CAST(NULL AS INTEGER) AS num_output_tokens, 0 AS drafts,
           CARDINALITY(m.sampled_token_ids) AS n
    FROM (SELECT DISTINCT inst FROM listed) d
    JOIN run_ids i ON i.inst = d.inst
    JOIN model_outputs m ON m.engine = i.engine AND m.req_id = i.req_id
         AND m.step >= i.intro_step AND (i.next_intro_step IS NULL OR m.step < i.next_intro_step)
    WHERE m.sampled_token_ids IS NOT NULL
),
counted AS (
    SELECT inst, step, late, kind, num_computed_tokens, num_scheduled_tokens, num_output_tokens,
           drafts,
           SUM(n) OVER (PARTITION BY inst ORDER BY step, late
                        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS sampled
    FROM events
),
paired AS (
    SELECT inst, step, kind, num_computed_tokens, num_output_tokens, sampled,
           LAG(step) OVER (PARTITION BY inst ORDER BY step) AS prev_step,
           LAG(num_output_tokens) OVER (PARTITION BY inst ORDER BY step) AS prev_outputs,
           LAG(sampled) OVER (PARTITION BY inst ORDER BY step) AS prev_sampled,
           LAG(num_computed_tokens + num_scheduled_tokens) OVER (PARTITION BY inst ORDER BY step)
               AS prev_end,
           LAG(drafts) OVER (PARTITION BY inst ORDER BY step) AS prev_drafts
    FROM counted
    WHERE late = 0
),
held AS (
    SELECT p.*,
           CASE WHEN p.prev_outputs IS NOT NULL
                     AND p.prev_outputs + p.sampled - p.prev_sampled < p.sampled
                THEN p.prev_outputs + p.sampled - p.prev_sampled ELSE p.sampled END AS held
    FROM paired p
)
SELECT k.engine, h.step, k.req_id,
       h.kind || ': num_output_tokens ' || CAST(h.num_output_tokens AS VARCHAR) || ' < '
       || CAST(h.held AS VARCHAR) || ' outputs the worker holds ('
       || CASE WHEN h.held = h.sampled THEN 'sampled before this step'
               ELSE CAST(h.prev_outputs AS VARCHAR) || ' at step ' || CAST(h.prev_step AS VARCHAR)
                    || ' + ' || CAST(h.sampled - h.prev_sampled AS VARCHAR) || ' sampled since'
          END
       || ')' AS details
FROM held h
JOIN run_ids k ON k.inst = h.inst
JOIN engines e ON e.engine = k.engine
WHERE h.kind IN ('cached', 'resumed') AND h.num_output_tokens < h.held
  AND NOT (h.kind = 'cached' AND h.prev_end IS NOT NULL
           AND h.num_computed_tokens < h.prev_end - h.prev_drafts)
  AND NOT (h.kind = 'resumed' AND COALESCE(e.pipeline_parallel_size, 1) > 1)
