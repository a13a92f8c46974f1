-- id: finished.leaked
-- severity: error
-- title: the engine finished a request but its id never reached the worker
-- why: The worker frees a request's cached state only when its id arrives in finished_req_ids;
--      an id that never arrives leaks that state (and its persistent-batch slot) for good.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._free_request (finished_req_ids);
--            vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: steps, finished, finish_events
-- columns: engine, step, req_id, details
-- note: finished ids travel with the next step, often a zero-token step that LLM.generate() does
--       not wait for: a finish with no later step in the trace is not blamed. With a finish
--       event at step e, the first step after e must carry the id.
WITH ev AS (
    SELECT DISTINCT engine, req_id, step AS event_step FROM finish_events
),
next_step AS (
    SELECT e.engine, e.req_id, e.event_step, MIN(s.step) AS due_step
    FROM ev e JOIN steps s ON s.engine = e.engine AND s.step > e.event_step
    GROUP BY e.engine, e.req_id, e.event_step
),
delivered AS (
    SELECT n.engine, n.req_id, n.event_step, n.due_step, MIN(f.step) AS delivered_step
    FROM next_step n
    LEFT JOIN finished f ON f.engine = n.engine AND f.req_id = n.req_id
         AND f.step > n.event_step
    GROUP BY n.engine, n.req_id, n.event_step, n.due_step
)
SELECT engine, due_step AS step, req_id,
       'finished at step ' || CAST(event_step AS VARCHAR) || ', '
       || CASE WHEN delivered_step IS NULL THEN 'never delivered in finished_req_ids'
               ELSE 'delivered only at step ' || CAST(delivered_step AS VARCHAR) END AS details
FROM delivered
WHERE delivered_step IS NULL OR delivered_step <> due_step
