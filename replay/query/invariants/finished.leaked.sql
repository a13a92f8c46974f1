-- id: finished.leaked
-- severity: error
-- title: the engine finished a request but its id never reached the worker
-- why: The worker frees a request's cached state only when its id arrives in finished_req_ids;
--      an id that never arrives leaks that state (and its persistent-batch slot) for good.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler._free_request (finished_req_ids);
--            vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: steps, finished, finish_events, transport (if present)
-- columns: engine, step, req_id, details
-- note: finished ids travel with the next step scheduled after the finish, often a zero-token
--       step that LLM.generate() does not wait for: a finish with no such step in the trace is
--       not blamed. That is the step after the finish's step, except where batches overlap
--       (async scheduling, pipeline parallelism: step_with_batch_queue schedules step e + 1
--       before step e's update finishes the request); there it is the first step whose
--       schedule() returned after the finish event (`t_ns`). Where the trace records the
--       transport (live engines), a delivery counts only if its step was handed to the executor.
WITH ev AS (
    SELECT engine, req_id, step AS event_step, MIN(t_ns) AS event_t
    FROM finish_events
    GROUP BY engine, req_id, step
),
step_order AS (
    SELECT engine, step, LEAD(step) OVER (PARTITION BY engine ORDER BY step) AS next_step
    FROM steps
),
due AS (
    -- events before the first recorded step (aborts at step -1) are due at the first step
    SELECT e.engine, e.req_id, e.event_step, e.event_t,
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
    SELECT d.engine, d.req_id, d.event_step, d.event_t, d.due_step,
           MIN(f.step) AS delivered_step
    FROM due d
    LEFT JOIN reached f ON f.engine = d.engine AND f.req_id = d.req_id
         AND f.step > d.event_step
    WHERE d.due_step IS NOT NULL
    GROUP BY d.engine, d.req_id, d.event_step, d.event_t, d.due_step
),
suspect AS (
    SELECT engine, req_id, event_step, event_t, delivered_step
    FROM delivered
    WHERE delivered_step IS NULL OR delivered_step <> due_step
),
offsets AS (
    -- a batch queue holds as many batches as pipeline stages: the step due is among the next
    -- few (equality joins only: a range join here would pair every suspect with every later
    -- step when ids leak for good)
    SELECT UNNEST(RANGE(1, 17)) AS d
),
candidates AS (
    SELECT u.engine, u.req_id, u.event_step, u.event_t, u.event_step + o.d AS step
    FROM suspect u CROSS JOIN offsets o
),
overlapped AS (
    -- the first of them scheduled after the finish by the clock; where all sixteen are there
    -- and none was (a wall clock set back, in a trace recorded before t_ns came from a
    -- monotonic clock), the next one
    SELECT c.engine, c.req_id, c.event_step,
           COALESCE(MIN(CASE WHEN s.t_ns > c.event_t THEN s.step END),
                    CASE WHEN COUNT(*) = 16 THEN MIN(s.step) END) AS due_step
    FROM candidates c
    JOIN steps s ON s.engine = c.engine AND s.step = c.step
    GROUP BY c.engine, c.req_id, c.event_step
)
SELECT u.engine, o.due_step AS step, u.req_id,
       'finished at step ' || CAST(u.event_step AS VARCHAR) || ', '
       || CASE WHEN u.delivered_step IS NULL THEN 'never reached the worker in finished_req_ids'
               ELSE 'reached the worker only at step ' || CAST(u.delivered_step AS VARCHAR) END
       AS details
FROM suspect u
JOIN overlapped o ON o.engine = u.engine AND o.req_id = u.req_id AND o.event_step = u.event_step
WHERE o.due_step IS NOT NULL
  AND (u.delivered_step IS NULL OR u.delivered_step > o.due_step)
