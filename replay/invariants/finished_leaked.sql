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
--       event at step e, the first step after e must carry the id. Where the trace records the
--       transport (live engines), a delivery counts only if its step was handed to the executor.
WITH ev AS (
    SELECT DISTINCT engine, req_id, step AS event_step FROM finish_events
),
step_order AS (
    SELECT engine, step, LEAD(step) OVER (PARTITION BY engine ORDER BY step) AS next_step
    FROM steps
),
due AS (
    -- events before the first recorded step (aborts at step -1) are due at the first step
    SELECT e.engine, e.req_id, e.event_step,
           CASE WHEN e.event_step < f.first_step THEN f.first_step ELSE o.next_step END
               AS due_step
    FROM ev e
    JOIN (SELECT engine, MIN(step) AS first_step FROM steps GROUP BY engine) f
         ON f.engine = e.engine
    LEFT JOIN step_order o ON o.engine = e.engine AND o.step = e.event_step
),
tracked AS (
    SELECT DISTINCT engine FROM transport WHERE event = 'executed'
),
reached AS (
    -- deliveries that reached the worker: every one, unless the engine's transport is recorded
    SELECT f.engine, f.step, f.req_id
    FROM finished f
    LEFT JOIN tracked t ON t.engine = f.engine
    LEFT JOIN (SELECT DISTINCT engine, step FROM transport WHERE event = 'executed') x
         ON x.engine = f.engine AND x.step = f.step
    WHERE t.engine IS NULL OR x.step IS NOT NULL
),
delivered AS (
    SELECT d.engine, d.req_id, d.event_step, d.due_step, MIN(f.step) AS delivered_step
    FROM due d
    LEFT JOIN reached f ON f.engine = d.engine AND f.req_id = d.req_id
         AND f.step > d.event_step
    WHERE d.due_step IS NOT NULL
    GROUP BY d.engine, d.req_id, d.event_step, d.due_step
)
SELECT engine, due_step AS step, req_id,
       'finished at step ' || CAST(event_step AS VARCHAR) || ', '
       || CASE WHEN delivered_step IS NULL THEN 'never reached the worker in finished_req_ids'
               ELSE 'reached the worker only at step ' || CAST(delivered_step AS VARCHAR) END
       AS details
FROM delivered
WHERE delivered_step IS NULL OR delivered_step <> due_step
