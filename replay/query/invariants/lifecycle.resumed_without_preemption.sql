-- id: lifecycle.resumed_without_preemption
-- severity: warning
-- title: a request is resumed although it was not preempted since it last ran
-- why: The worker throws away the request's block table and takes the new one as whole: if the
--      scheduler did not preempt it, the request loses the KV it computed.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._preempt_request / _make_cached_request_data
-- needs: scheduled, runs, run_ids, preempted, engines
-- columns: engine, step, req_id, details
-- note: in a trace attached mid-stream (engines.attached_mid_stream), an id whose first row is
--       a resumption may have been preempted before the recording began.
WITH resumed AS (
    SELECT k.engine, r.step, k.req_id, r.prev_step AS last_run
    FROM runs r
    JOIN run_ids k ON k.inst = r.inst
    WHERE r.kind = 'resumed'
),
last_preempt AS (
    SELECT r.engine, r.step, r.req_id, MAX(p.step) AS last_preempt
    FROM resumed r
    JOIN preempted p ON p.engine = r.engine AND p.req_id = r.req_id AND p.step <= r.step
    GROUP BY r.engine, r.step, r.req_id
)
SELECT r.engine, r.step, r.req_id,
       'resumed; last ran at step ' || COALESCE(CAST(r.last_run AS VARCHAR), 'never')
       || ', no preemption since' AS details
FROM resumed r
JOIN engines e ON e.engine = r.engine
LEFT JOIN last_preempt p ON p.engine = r.engine AND p.step = r.step AND p.req_id = r.req_id
WHERE (p.last_preempt IS NULL AND (r.last_run IS NOT NULL OR NOT e.attached_mid_stream))
   OR (r.last_run IS NOT NULL AND p.last_preempt < r.last_run)
