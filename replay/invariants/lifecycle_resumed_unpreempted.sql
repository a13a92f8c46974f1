-- id: lifecycle.resumed_without_preemption
-- severity: warning
-- title: a request is resumed although it was not preempted since it last ran
-- why: The worker throws away the request's block table and takes the new one as whole: if the
--      scheduler did not preempt it, the request loses the KV it computed.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._preempt_request / _make_cached_request_data
-- needs: scheduled, preempted
-- columns: engine, step, req_id, details
WITH resumed AS (
    SELECT engine, step, req_id FROM scheduled WHERE kind = 'resumed'
),
last_run AS (
    SELECT r.engine, r.step, r.req_id, MAX(s.step) AS last_run
    FROM resumed r
    JOIN scheduled s ON s.engine = r.engine AND s.req_id = r.req_id AND s.step < r.step
         AND s.kind IS NOT NULL
    GROUP BY r.engine, r.step, r.req_id
),
last_preempt AS (
    SELECT r.engine, r.step, r.req_id, MAX(p.step) AS last_preempt
    FROM resumed r
    JOIN preempted p ON p.engine = r.engine AND p.req_id = r.req_id AND p.step <= r.step
    GROUP BY r.engine, r.step, r.req_id
)
SELECT r.engine, r.step, r.req_id,
       'resumed; last ran at step ' || COALESCE(CAST(l.last_run AS VARCHAR), 'never')
       || ', no preemption since' AS details
FROM resumed r
LEFT JOIN last_run l ON l.engine = r.engine AND l.step = r.step AND l.req_id = r.req_id
LEFT JOIN last_preempt p ON p.engine = r.engine AND p.step = r.step AND p.req_id = r.req_id
WHERE p.last_preempt IS NULL OR (l.last_run IS NOT NULL AND p.last_preempt < l.last_run)
