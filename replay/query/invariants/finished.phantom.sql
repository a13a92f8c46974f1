-- id: finished.phantom
-- severity: info
-- title: a finished id the worker never held
-- why: Requests aborted before they were ever scheduled still get their id freed; the worker
--      ignores unknown ids, so this is harmless, but it is not a request the worker knew.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._free_request
-- needs: finished, requests
-- columns: engine, step, req_id, details
-- note: only an introduction before the delivering step counts (the worker frees finished ids
--       before it adds the step's new requests, so one in that step or later came after). In a
--       trace started by attaching mid-stream, ids introduced before the first step look like
--       this too.
SELECT f.engine, f.step, f.req_id, 'in finished_req_ids, never in scheduled_new_reqs' AS details
FROM finished f
LEFT JOIN (SELECT engine, req_id, MIN(step) AS first_intro FROM requests
           GROUP BY engine, req_id) r
     ON r.engine = f.engine AND r.req_id = f.req_id AND r.first_intro < f.step
WHERE r.req_id IS NULL
