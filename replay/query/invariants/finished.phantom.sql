-- id: finished.phantom
-- severity: info
-- title: a finished id the worker never held
-- why: Requests aborted before they were ever scheduled still get their id freed; the worker
--      ignores unknown ids, so this is harmless, but it is not a request the worker knew.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._free_request
-- needs: finished, requests, engines, steps, scheduled
-- columns: engine, step, req_id, details
-- note: only an introduction before the delivering step counts (the worker frees finished ids
--       before it adds the step's new requests, so one in that step or later came after). In a
--       trace started by attaching mid-stream (engines.attached_mid_stream), the ids owed at the
--       attach (delivered at the first recorded step) and those of requests the worker held
--       from before it (scheduled as cached before their delivery) are not reported.
WITH phantom AS (
    SELECT f.engine, f.step, f.req_id
    FROM finished f
    LEFT JOIN (SELECT engine, req_id, MIN(step) AS first_intro FROM requests
               GROUP BY engine, req_id) r
         ON r.engine = f.engine AND r.req_id = f.req_id AND r.first_intro < f.step
    WHERE r.req_id IS NULL
),
held_before AS (
    SELECT DISTINCT p.engine, p.step, p.req_id
    FROM phantom p
    JOIN scheduled s ON s.engine = p.engine AND s.req_id = p.req_id AND s.step < p.step
    WHERE s.kind IN ('cached', 'resumed')
),
first_step AS (
    SELECT engine, MIN(step) AS step FROM steps GROUP BY engine
)
SELECT p.engine, p.step, p.req_id, 'in finished_req_ids, never in scheduled_new_reqs' AS details
FROM phantom p
JOIN engines e ON e.engine = p.engine
LEFT JOIN first_step fs ON fs.engine = p.engine
LEFT JOIN held_before h ON h.engine = p.engine AND h.step = p.step AND h.req_id = p.req_id
WHERE NOT e.attached_mid_stream OR (p.step <> fs.step AND h.req_id IS NULL)
