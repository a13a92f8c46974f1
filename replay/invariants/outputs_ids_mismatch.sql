-- id: outputs.ids_mismatch
-- severity: error
-- title: the model output's request ids differ from the step's scheduled ids
-- why: update_from_output() indexes sampled tokens by req_id_to_index; a missing id drops that
--      request's token, an extra one is a request the scheduler did not run.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler.update_from_output
-- needs: scheduled, model_outputs, updates, step_totals
-- columns: engine, step, req_id, details
WITH sched_fp AS (
    -- Most steps match, so each step's ids are first compared as a fingerprint (count and sum of
    -- hashes) and only the steps whose fingerprints differ are joined id by id: the full join of a
    -- million-step trace spilled (18 s; 2.6 s this way). Two different id sets of one step escape
    -- only if their 64-bit hash sums collide.
    SELECT engine, step, n, ids_hash AS h FROM step_totals
),
out_fp AS (
    SELECT engine, step, COUNT(*) AS n, SUM(HASH(req_id)) AS h FROM model_outputs
    GROUP BY engine, step
),
suspect AS (
    SELECT u.engine, u.step
    FROM (SELECT DISTINCT engine, step FROM updates) u
    LEFT JOIN sched_fp s ON s.engine = u.engine AND s.step = u.step
    LEFT JOIN out_fp o ON o.engine = u.engine AND o.step = u.step
    WHERE COALESCE(s.n, 0) <> COALESCE(o.n, 0) OR COALESCE(s.h, 0) <> COALESCE(o.h, 0)
),
bounds AS (
    -- a range filter before the join: usually no step is suspect, and then it has no row and
    -- neither table is read again
    SELECT MIN(step) AS lo, MAX(step) AS hi FROM suspect HAVING COUNT(*) > 0
),
s2 AS (
    SELECT s.engine, s.step, s.req_id FROM scheduled s
    JOIN bounds b ON s.step >= b.lo AND s.step <= b.hi
    WHERE s.num_scheduled_tokens IS NOT NULL
),
m2 AS (
    SELECT m.engine, m.step, m.req_id FROM model_outputs m
    JOIN bounds b ON m.step >= b.lo AND m.step <= b.hi
)
SELECT COALESCE(s.engine, m.engine) AS engine, COALESCE(s.step, m.step) AS step,
       COALESCE(s.req_id, m.req_id) AS req_id,
       CASE WHEN m.req_id IS NULL THEN 'scheduled but missing from the model output'
            ELSE 'in the model output but not scheduled' END AS details
FROM s2 s
FULL OUTER JOIN m2 m ON m.engine = s.engine AND m.step = s.step AND m.req_id = s.req_id
JOIN suspect p ON p.engine = COALESCE(s.engine, m.engine) AND p.step = COALESCE(s.step, m.step)
WHERE s.req_id IS NULL OR m.req_id IS NULL
