-- id: trace.impossible_steps
-- severity: error
-- title: step numbers the recorder cannot have written
-- why: The recorder numbers steps from 0, one per schedule() call (-1 only for an abort before
--      the first step, in finish_events); a negative, missing or astronomically large step
--      (2^40 or more: decades of steps) is damage, and the rows it keys are attributed to
--      steps that never ran.
-- relies_on: vllm_contract trace format (step numbering)
-- needs: steps (if present), scheduled (if present), requests (if present), mm_inputs (if present),
--        finished (if present), preempted (if present), freed_mm (if present),
--        updates (if present), model_outputs (if present), finish_events (if present),
--        extra_fields (if present), transport (if present), redacted (if present),
--        malformed_steps (if present)
-- columns: engine, step, req_id (NULL), details
WITH bad AS (
    SELECT engine, 'steps' AS tbl, step FROM steps
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'scheduled' AS tbl, step FROM scheduled
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'requests' AS tbl, step FROM requests
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'mm_inputs' AS tbl, step FROM mm_inputs
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'finished' AS tbl, step FROM finished
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'preempted' AS tbl, step FROM preempted
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'freed_mm' AS tbl, step FROM freed_mm
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'updates' AS tbl, step FROM updates
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'model_outputs' AS tbl, step FROM model_outputs
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'finish_events' AS tbl, step FROM finish_events
    WHERE step IS NULL OR step < -1 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'extra_fields' AS tbl, step FROM extra_fields
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'transport' AS tbl, step FROM transport
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'redacted' AS tbl, step FROM redacted
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
    UNION ALL
    SELECT engine, 'malformed_steps' AS tbl, step FROM malformed_steps
    WHERE step IS NULL OR step < 0 OR step >= 1099511627776
)
SELECT engine, MIN(step) AS step, CAST(NULL AS VARCHAR) AS req_id,
       tbl || ': ' || CAST(COUNT(*) AS VARCHAR) || ' row(s) with impossible step numbers ('
       || COALESCE(CAST(MIN(step) AS VARCHAR) || '..' || CAST(MAX(step) AS VARCHAR), '')
       || CASE WHEN COUNT(*) > COUNT(step)
               THEN CASE WHEN COUNT(step) > 0 THEN ', ' ELSE '' END
                    || CAST(COUNT(*) - COUNT(step) AS VARCHAR) || ' NULL'
               ELSE '' END || ')' AS details
FROM bad
GROUP BY engine, tbl
