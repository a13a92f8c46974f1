-- id: outputs.all_token_ids_mismatch
-- severity: error
-- title: the all_token_ids an async worker rebuilds a request's outputs from do not end in its outputs
-- why: With async scheduling the worker takes the last num_output_tokens entries of
--      all_token_ids[req_id] as the outputs of a cached request that is not in its persistent
--      batch (resumed, or given no token count in the step before). Where they are not the
--      tokens the request sampled, it feeds the model other tokens than it produced, and the
--      penalties and stop checks read them too (silent).
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states (resumed_token_ids[-num_output_tokens:]); vllm/v1/core/sched/scheduler.py Scheduler._make_cached_request_data (req.all_token_ids.copy())
-- needs: windowed_runs, run_ids, engines, scheduled, model_outputs
-- columns: engine, step, req_id, details
-- note: the rows outputs.all_token_ids_missing reads, where the list is there (not redacted)
--       and holds at least num_output_tokens entries. They are compared with the instance's
--       sampled tokens in step order, and only where those number exactly num_output_tokens
--       before the row's step: not after a reset_prefix_cache that dropped in-flight output
--       (drop_stale_output: the scheduler kept fewer tokens than were sampled), nor across steps
--       the recorder dropped.
WITH needing AS (
    SELECT w.inst, k.engine, w.step, k.req_id, w.num_output_tokens
    FROM windowed_runs w
    JOIN run_ids k ON k.inst = w.inst
    JOIN engines e ON e.engine = k.engine
    WHERE e.async_scheduling AND w.inst > 0 AND w.kind IN ('cached', 'resumed')
      AND w.num_output_tokens > 0
      AND (w.kind = 'resumed' OR w.prev_step IS NULL OR w.prev_step < w.step - 1
           OR w.prev_end IS NULL)
),
sent AS (
    SELECT n.inst, n.engine, n.step, n.req_id, n.num_output_tokens, s.all_token_ids
    FROM needing n
    JOIN scheduled s ON s.engine = n.engine AND s.step = n.step AND s.req_id = n.req_id
    WHERE s.all_token_ids IS NOT NULL AND CARDINALITY(s.all_token_ids) >= n.num_output_tokens
),
outs AS (
    -- the sampled tokens of those instances, each step's with how many came before it
    SELECT d.inst, m.step, m.sampled_token_ids, CARDINALITY(m.sampled_token_ids) AS n,
           COALESCE(SUM(CARDINALITY(m.sampled_token_ids)) OVER (
               PARTITION BY d.inst ORDER BY m.step
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
    FROM (SELECT DISTINCT inst FROM sent) d
    JOIN run_ids i ON i.inst = d.inst
    JOIN model_outputs m ON m.engine = i.engine AND m.req_id = i.req_id
         AND m.step >= i.intro_step AND (i.next_intro_step IS NULL OR m.step < i.next_intro_step)
    WHERE m.sampled_token_ids IS NOT NULL
),
whole AS (
    -- the rows whose outputs before them number exactly num_output_tokens
    SELECT s.inst, s.engine, s.step, s.req_id, s.num_output_tokens, s.all_token_ids
    FROM sent s
    JOIN (SELECT s.inst, s.step
          FROM sent s
          JOIN outs o ON o.inst = s.inst AND o.step < s.step
          GROUP BY s.inst, s.step, s.num_output_tokens
          HAVING SUM(o.n) = s.num_output_tokens) c ON c.inst = s.inst AND c.step = s.step
),
tail AS (
    -- each sent token's place counted from the first of the last num_output_tokens; both sides
    -- number from the same base (ordinals are 1-based in DuckDB, 0-based on Spark), and the
    -- prompt's tokens fall below it
    SELECT w.inst, w.step, w.engine, w.req_id, w.num_output_tokens,
           t.i - (CARDINALITY(w.all_token_ids) - w.num_output_tokens) AS place, t.tok
    FROM whole w, UNNEST(w.all_token_ids) WITH ORDINALITY AS t(tok, i)
),
sampled AS (
    SELECT o.inst, o.step, o.before + t.i AS place, t.tok
    FROM outs o, UNNEST(o.sampled_token_ids) WITH ORDINALITY AS t(tok, i)
)
SELECT a.engine, a.step, a.req_id,
       CAST(SUM(CASE WHEN a.tok <> b.tok THEN 1 ELSE 0 END) AS VARCHAR) || ' of the last '
       || CAST(a.num_output_tokens AS VARCHAR)
       || ' all_token_ids differ from the tokens the request sampled' AS details
FROM tail a
JOIN sampled b ON b.inst = a.inst AND b.step < a.step AND b.place = a.place
GROUP BY a.engine, a.step, a.req_id, a.num_output_tokens
HAVING SUM(CASE WHEN a.tok <> b.tok THEN 1 ELSE 0 END) > 0
