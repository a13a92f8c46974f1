-- id: lifecycle.resumed_without_preemption
-- severity: warning
-- title: a request is resumed although it was not preempted since it last ran
-- why: The worker throws away the request's block table and takes the new one as whole: if the
--      scheduler did not preempt it, the request loses the KV it computed.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._preempt_request / _make_cached_request_data
-- needs: scheduled, preempted
-- columns: engine, step, req_id, details
WITH ev AS (
    SELECT engine, req_id, step, 1 AS ord, 'preempt' AS what FROM preempted
    UNION ALL
    SELECT engine, req_id, step, 2 AS ord, kind AS what FROM scheduled
    WHERE kind IN ('new', 'cached', 'resumed')
),
state AS (
    SELECT engine, req_id, step, what,
           MAX(CASE WHEN what <> 'preempt' THEN step END) OVER (
               PARTITION BY engine, req_id ORDER BY step, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS last_run,
           MAX(CASE WHEN what = 'preempt' THEN step END) OVER (
               PARTITION BY engine, req_id ORDER BY step, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS last_preempt
    FROM ev
)
SELECT engine, step, req_id,
       'resumed; last ran at step ' || COALESCE(CAST(last_run AS VARCHAR), 'never')
       || ', no preemption since' AS details
FROM state
WHERE what = 'resumed' AND (last_preempt IS NULL OR (last_run IS NOT NULL AND last_preempt < last_run))
