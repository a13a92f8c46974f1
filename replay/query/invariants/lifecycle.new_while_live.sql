-- id: lifecycle.new_while_live
-- severity: error
-- title: a new request whose id the worker still holds
-- why: The worker treats a scheduled_new_reqs entry for a cached id as a streaming update and
--      keeps the old state (output tokens, block table): the scheduler meant a new request.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_streaming_request
-- needs: requests, finished, finish_events, instances
-- columns: engine, step, req_id, details
-- note: a streaming-input session (resumable request) is re-sent as new after each turn the
--       engine finished (a finish event) without freeing it: that is a streaming update, not a
--       break, and is not reported.
WITH reintro AS (
    -- an instance whose id is introduced again, and whether the worker had freed it by then
    SELECT engine, req_id, intro_step, next_intro_step FROM instances
    WHERE next_intro_step IS NOT NULL AND freed_step IS NULL
),
turns AS (
    SELECT DISTINCT r.engine, r.req_id, r.intro_step
    FROM reintro r
    JOIN finish_events e ON e.engine = r.engine AND e.req_id = r.req_id
         AND e.step >= r.intro_step AND e.step < r.next_intro_step
)
SELECT r.engine, r.next_intro_step AS step, r.req_id,
       'introduced again while the instance from step ' || CAST(r.intro_step AS VARCHAR)
       || ' is still held by the worker (never in finished_req_ids)' AS details
FROM reintro r
LEFT JOIN turns t ON t.engine = r.engine AND t.req_id = r.req_id AND t.intro_step = r.intro_step
WHERE t.req_id IS NULL
