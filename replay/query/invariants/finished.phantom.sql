-- id: finished.phantom
-- severity: info
-- title: a finished id the worker never held
-- why: Requests aborted before they were ever scheduled still get their id freed; the worker
--      ignores unknown ids, so this is harmless, but it is not a request the worker knew.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._free_request
-- needs: finished, requests
-- columns: engine, step, req_id, details
-- note: in a trace started by attaching mid-stream, ids introduced before the first step look
--       like this too.
SELECT f.engine, f.step, f.req_id, 'in finished_req_ids, never in scheduled_new_reqs' AS details
FROM finished f
LEFT JOIN (SELECT DISTINCT engine, req_id FROM requests) r
     ON r.engine = f.engine AND r.req_id = f.req_id
WHERE r.req_id IS NULL
