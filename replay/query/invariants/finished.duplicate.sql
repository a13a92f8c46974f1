-- id: finished.duplicate
-- severity: warning
-- title: the same finished id is delivered twice without a new introduction between
-- why: Harmless to the worker (unknown ids are ignored), but the scheduler freed one request
--      twice: its bookkeeping of finished requests is off.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._free_request
-- needs: finished, requests, added
-- columns: engine, step, req_id, details
-- note: an id comes back each time a request of that id is freed, scheduled or not: one added
--       again and aborted before it ever ran is freed (and delivered) again. A new request of
--       the id is one scheduled as new from the earlier delivery's step, or one added after the
--       earlier delivery's free: the free came after schedule() of the step before it, so an
--       add logged after that step's schedule() (`added.step` >= prev_step - 1) and before the
--       later delivery's schedule() counts. Without the input log (attached mid-run, older
--       recorders) only the scheduled introductions count.
WITH pairs AS (
    -- each delivery with the delivery of the same id just before it
    SELECT f.engine, f.req_id, f.step, MAX(p.step) AS prev_step
    FROM finished f
    JOIN finished p ON p.engine = f.engine AND p.req_id = f.req_id AND p.step < f.step
    GROUP BY f.engine, f.req_id, f.step
),
reintroduced AS (
    SELECT DISTINCT q.engine, q.req_id, q.step
    FROM pairs q
    JOIN requests r ON r.engine = q.engine AND r.req_id = q.req_id
         AND r.step >= q.prev_step AND r.step < q.step
    UNION
    SELECT q.engine, q.req_id, q.step
    FROM pairs q
    JOIN added a ON a.engine = q.engine AND a.req_id = q.req_id
         AND a.step >= q.prev_step - 1 AND a.step < q.step
)
SELECT q.engine, q.step, q.req_id,
       'already delivered at step ' || CAST(q.prev_step AS VARCHAR) AS details
FROM pairs q
LEFT JOIN reintroduced r ON r.engine = q.engine AND r.req_id = q.req_id AND r.step = q.step
WHERE r.req_id IS NULL
