-- id: trace.missing_steps
-- severity: warning
-- title: step numbers missing from the steps table
-- why: A hole in the step sequence that the recorder did not declare as dropped: the trace was
--      damaged or edited; nothing inside the hole can be checked.
-- relies_on: vllm_contract trace format
-- needs: steps
-- columns: engine, step, req_id (NULL), details
WITH seq AS (
    SELECT engine, step, LAG(step) OVER (PARTITION BY engine ORDER BY step) AS prev_step
    FROM steps
)
SELECT s.engine, s.prev_step + 1 AS step, CAST(NULL AS VARCHAR) AS req_id,
       'steps ' || CAST(s.prev_step + 1 AS VARCHAR) || '..' || CAST(s.step - 1 AS VARCHAR)
       || ' missing' AS details
FROM seq s
LEFT JOIN dropped d ON d.engine = s.engine AND d.first_step = s.prev_step + 1
WHERE s.step - s.prev_step > 1 AND d.engine IS NULL
