-- id: trace.count_mismatch
-- severity: error
-- title: the steps on disk disagree with the manifest's count
-- why: The recorder counts every step it writes (steps_recorded): fewer rows on disk means
--      segments were lost or truncated after the fact, more rows after a clean close means rows
--      were copied or added; either way the trace is not what was recorded.
-- relies_on: vllm_contract recorder (manifest steps_recorded, pruned_segments)
-- needs: engines, steps (if present)
-- columns: engine, step (NULL), req_id (NULL), details
-- note: more rows than counted in a trace not closed cleanly (its manifest may predate the
--      last writes), fewer after a recorder error (its buffered rows were never written)
WITH disk AS (
    SELECT engine, COUNT(*) AS n FROM steps GROUP BY engine
),
c AS (
    SELECT e.engine, e.steps_recorded, e.pruned_steps, e.closed_cleanly, e.recorder_errors,
           COALESCE(d.n, 0) AS on_disk
    FROM engines e
    LEFT JOIN disk d ON d.engine = e.engine
)
SELECT engine, CAST(NULL AS BIGINT) AS step, CAST(NULL AS VARCHAR) AS req_id,
       'the manifest counts ' || CAST(steps_recorded AS VARCHAR) || ' steps written, the steps '
       || 'table holds ' || CAST(on_disk AS VARCHAR)
       || CASE WHEN pruned_steps > 0
               THEN ' (and ' || CAST(pruned_steps AS VARCHAR) || ' were deleted at the size cap)'
               ELSE '' END AS details
FROM c
WHERE steps_recorded IS NOT NULL
  AND ((on_disk + pruned_steps < steps_recorded AND recorder_errors = 0)
       OR (closed_cleanly AND on_disk > steps_recorded))
