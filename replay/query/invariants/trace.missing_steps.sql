-- id: trace.missing_steps
-- severity: warning
-- title: step numbers missing from the steps table
-- why: A hole in the step sequence that the recorder did not declare as dropped: the trace was
--      damaged or edited; nothing inside the hole can be checked.
-- relies_on: vllm_contract trace format
-- needs: steps, malformed_steps, dropped
-- columns: engine, step, req_id (NULL), details
-- note: the recorder numbers steps from 0 (also when it attaches mid-stream) and declares every
--       step it dropped or pruned, the trace's head included, in dropped_steps; so steps before
--       the first recorded one are a hole too, and so is each part of a hole that no declared
--       range covers. Steps after the last recorded one are not known to have run.
WITH present AS (
    SELECT engine, step AS first_step, step AS last_step FROM steps
    UNION ALL  -- a quarantined step is not missing: trace.malformed_step reports it
    SELECT engine, step, step FROM malformed_steps WHERE stage <> 'update'
),
spans AS (
    -- what is accounted for: recorded steps and declared drops, and a step -1 that makes
    -- the head of the trace a gap like any other
    SELECT engine, first_step, last_step FROM present
    UNION ALL
    SELECT engine, first_step, last_step FROM dropped
    UNION ALL
    SELECT engine, -1, -1 FROM (SELECT DISTINCT engine FROM present)
),
reach AS (
    SELECT engine, first_step,
           MAX(last_step) OVER (PARTITION BY engine ORDER BY first_step, last_step
                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_to
    FROM spans
),
last_recorded AS (
    SELECT engine, MAX(last_step) AS last_step FROM present GROUP BY engine
)
SELECT r.engine, r.covered_to + 1 AS step, CAST(NULL AS VARCHAR) AS req_id,
       'steps ' || CAST(r.covered_to + 1 AS VARCHAR) || '..' || CAST(r.first_step - 1 AS VARCHAR)
       || ' missing' AS details
FROM reach r
JOIN last_recorded l ON l.engine = r.engine
WHERE r.first_step > r.covered_to + 1 AND r.first_step <= l.last_step
