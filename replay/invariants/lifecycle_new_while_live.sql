-- id: lifecycle.new_while_live
-- severity: error
-- title: a new request whose id the worker still holds
-- why: The worker treats a scheduled_new_reqs entry for a cached id as a streaming update and
--      keeps the old state (output tokens, block table): the scheduler meant a new request.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_streaming_request
-- needs: requests, finished, finish_events
-- columns: engine, step, req_id, details
-- note: a streaming-input session (resumable request) is re-sent as new after each turn the
--       engine finished (a finish event) without freeing it: that is a streaming update, not a
--       break, and is not reported.
WITH ev AS (
    SELECT engine, req_id, step, 1 AS ord, 'finish' AS what FROM finished
    UNION ALL
    SELECT engine, req_id, step, 2 AS ord, 'intro' AS what FROM requests
    UNION ALL
    SELECT engine, req_id, step, 0 AS ord, 'event' AS what FROM finish_events
),
state AS (
    SELECT engine, req_id, step, what,
           MAX(CASE WHEN what = 'intro' THEN step END) OVER (
               PARTITION BY engine, req_id ORDER BY step, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS last_intro,
           MAX(CASE WHEN what = 'finish' THEN step END) OVER (
               PARTITION BY engine, req_id ORDER BY step, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS last_finish,
           MAX(CASE WHEN what = 'event' THEN step END) OVER (
               PARTITION BY engine, req_id ORDER BY step, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS last_event
    FROM ev
)
SELECT engine, step, req_id,
       'introduced again while the instance from step ' || CAST(last_intro AS VARCHAR)
       || ' is still held by the worker (never in finished_req_ids)' AS details
FROM state
WHERE what = 'intro' AND last_intro IS NOT NULL
  AND (last_finish IS NULL OR last_finish <= last_intro)
  AND (last_event IS NULL OR last_event < last_intro)
