-- id: outputs.ids_mismatch
-- severity: error
-- title: the model output's request ids differ from the step's scheduled ids
-- why: update_from_output() indexes sampled tokens by req_id_to_index; a missing id drops that
--      request's token, an extra one is a request the scheduler did not run.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler.update_from_output
-- needs: scheduled, model_outputs, updates, step_totals
-- columns: engine, step, req_id, details
WITH updated AS (
    SELECT engine, MIN(step) AS lo, MAX(step) AS hi, COUNT(DISTINCT step) AS n_steps
    FROM updates
    GROUP BY engine
),
whole AS (
    -- an engine whose updated steps run unbroken from its first to its last
    SELECT engine, lo, hi FROM updated WHERE n_steps = hi - lo + 1
),
sched_all AS (
    SELECT w.engine, SUM(t.n) AS n, SUM(t.ids_fp_0) AS h0, SUM(t.ids_fp_1) AS h1
    FROM whole w
    JOIN step_totals t ON t.engine = w.engine AND t.step >= w.lo AND t.step <= w.hi
    GROUP BY w.engine
),
out_all AS (
    -- every row (a join with the span would cost more than the sums): the span's bounds say
    -- whether they all lie in it. The fingerprints are step_totals' (views.fingerprint).
    SELECT m.engine, COUNT(*) AS n,
           SUM(CAST(HASH(m.step, m.req_id) % 2147483579 AS BIGINT)) AS h0,
           SUM(CAST(HASH(m.req_id, m.step) % 2147483549 AS BIGINT)) AS h1,
           MIN(m.step) AS lo, MAX(m.step) AS hi
    FROM model_outputs m
    GROUP BY m.engine
),
settled AS (
    -- Such an engine's rows are first compared as a whole: the count and the sums of the
    -- fingerprints of (step, req_id) of its listed rows in that span against its model
    -- output's, when the model output has no row outside the span. They agree exactly when no
    -- step differs (barring a collision of both fingerprints), and then neither table is grouped by step (the model
    -- output's grouping was most of the check's time).
    SELECT w.engine
    FROM whole w
    LEFT JOIN sched_all a ON a.engine = w.engine
    LEFT JOIN out_all o ON o.engine = w.engine
    WHERE COALESCE(a.n, 0) = COALESCE(o.n, 0) AND COALESCE(a.h0, 0) = COALESCE(o.h0, 0)
      AND COALESCE(a.h1, 0) = COALESCE(o.h1, 0)
      AND (o.engine IS NULL OR (o.lo >= w.lo AND o.hi <= w.hi))
),
unsettled AS (
    SELECT u.engine FROM updated u
    LEFT JOIN settled t ON t.engine = u.engine
    WHERE t.engine IS NULL
),
unsettled_span AS (
    -- no row when every engine is settled: then the range joins below read nothing (a join
    -- with `unsettled` itself could take the model output as its build side)
    SELECT MIN(u.lo) AS lo, MAX(u.hi) AS hi
    FROM updated u JOIN unsettled x ON x.engine = u.engine
    HAVING COUNT(*) > 0
),
sched_fp AS (
    -- The other engines' steps are compared each by count and sums of fingerprints, and only
    -- the steps whose sums differ are joined id by id: the full join of a million-step trace
    -- spilled. Two different id sets of one step escape only if both
    -- fingerprints' sums collide.
    SELECT t.engine, t.step, t.n, t.ids_fp_0 AS h0, t.ids_fp_1 AS h1
    FROM step_totals t JOIN unsettled_span b ON t.step >= b.lo AND t.step <= b.hi
),
out_fp AS (
    SELECT m.engine, m.step, COUNT(*) AS n,
           SUM(CAST(HASH(m.step, m.req_id) % 2147483579 AS BIGINT)) AS h0,
           SUM(CAST(HASH(m.req_id, m.step) % 2147483549 AS BIGINT)) AS h1
    FROM model_outputs m JOIN unsettled_span b ON m.step >= b.lo AND m.step <= b.hi
    GROUP BY m.engine, m.step
),
suspect AS (
    SELECT u.engine, u.step
    FROM (SELECT DISTINCT d.engine, d.step FROM updates d
          JOIN unsettled x ON x.engine = d.engine) u
    LEFT JOIN sched_fp s ON s.engine = u.engine AND s.step = u.step
    LEFT JOIN out_fp o ON o.engine = u.engine AND o.step = u.step
    WHERE COALESCE(s.n, 0) <> COALESCE(o.n, 0) OR COALESCE(s.h0, 0) <> COALESCE(o.h0, 0)
       OR COALESCE(s.h1, 0) <> COALESCE(o.h1, 0)
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
