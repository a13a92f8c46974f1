-- id: finished.duplicate
-- severity: warning
-- title: the same finished id is delivered twice without a new introduction between
-- why: Harmless to the worker (unknown ids are ignored), but the scheduler freed one request
--      twice: its bookkeeping of finished requests is off.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._free_request
-- needs: finished, requests
-- columns: engine, step, req_id, details
WITH ev AS (
    SELECT engine, req_id, step, 1 AS ord, 'finish' AS what FROM finished
    UNION ALL
    SELECT engine, req_id, step, 2 AS ord, 'intro' AS what FROM requests
),
state AS (
    SELECT engine, req_id, step, what,
           MAX(CASE WHEN what = 'intro' THEN step END) OVER (
               PARTITION BY engine, req_id ORDER BY step, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS last_intro,
           MAX(CASE WHEN what = 'finish' THEN step END) OVER (
               PARTITION BY engine, req_id ORDER BY step, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS last_finish
    FROM ev
)
SELECT engine, step, req_id,
       'already delivered at step ' || CAST(last_finish AS VARCHAR) AS details
FROM state
WHERE what = 'finish' AND last_finish IS NOT NULL
  AND (last_intro IS NULL OR last_intro < last_finish)
