-- id: progress.stalled
-- severity: warning
-- title: zero-token steps while requests wait and none runs
-- why: The engine spins: it sends the worker empty steps while work is queued and nothing holds
--      the KV cache, so nothing will ever free room for the waiting requests.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler.schedule
-- needs: steps
-- columns: engine, step, req_id (NULL), details
-- note: reported from the 8th consecutive such step (a grammar still compiling can cause a few).
WITH flagged AS (
    SELECT engine, step,
           CASE WHEN total_num_scheduled_tokens = 0 AND num_waiting > 0 AND num_running = 0
                THEN 1 ELSE 0 END AS stalled
    FROM steps
),
runs AS (
    SELECT engine, step, stalled,
           SUM(CASE WHEN stalled = 0 THEN 1 ELSE 0 END) OVER (
               PARTITION BY engine ORDER BY step
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS run_id
    FROM flagged
),
lengths AS (
    SELECT engine, run_id, MIN(step) AS first_step, COUNT(*) AS n
    FROM runs WHERE stalled = 1 GROUP BY engine, run_id
)
SELECT engine, first_step + 7 AS step, CAST(NULL AS VARCHAR) AS req_id,
       CAST(n AS VARCHAR) || ' consecutive zero-token steps from step '
       || CAST(first_step AS VARCHAR) || ' with requests waiting and none running' AS details
FROM lengths
WHERE n >= 8
