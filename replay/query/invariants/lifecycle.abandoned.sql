-- id: lifecycle.abandoned
-- severity: error
-- title: a request the worker holds is neither scheduled nor finished when the engine went idle
-- why: The worker keeps every introduced request until its id arrives in finished_req_ids; one
--      the scheduler forgot stays in the worker's caches for the life of the process.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states (self.requests)
-- needs: steps, instances, finished, finish_events, engines
-- columns: engine, step, req_id, details
-- note: only for a cleanly closed trace whose last step shows the scheduler idle (nothing running
--       or waiting); a request with a finish event whose delivery fell after the trace's end is
--       the normal end of a run, not this.
WITH last_step AS (
    SELECT engine, MAX(step) AS step FROM steps GROUP BY engine
),
idle AS (
    SELECT l.engine, l.step
    FROM last_step l
    JOIN steps s ON s.engine = l.engine AND s.step = l.step
    JOIN engines e ON e.engine = l.engine
    WHERE e.closed_cleanly AND s.num_running = 0 AND s.num_waiting = 0
),
open_ AS (
    -- the last instance of each id, never freed
    SELECT engine, req_id, intro_step FROM instances
    WHERE next_intro_step IS NULL AND freed_step IS NULL
),
evented AS (
    SELECT DISTINCT i.engine, i.req_id, i.intro_step
    FROM open_ i JOIN finish_events v ON v.engine = i.engine AND v.req_id = i.req_id
    WHERE v.step >= i.intro_step
)
SELECT d.engine, d.step, i.req_id,
       'introduced at step ' || CAST(i.intro_step AS VARCHAR)
       || ', never finished; the scheduler is idle' AS details
FROM open_ i
JOIN idle d ON d.engine = i.engine
LEFT JOIN evented x ON x.engine = i.engine AND x.req_id = i.req_id AND x.intro_step = i.intro_step
WHERE x.req_id IS NULL
