-- id: lifecycle.scheduled_after_finish
-- severity: error
-- title: a cached request scheduled after its finish reached the worker
-- why: The worker dropped the request's state when the id arrived in finished_req_ids; the
--      next scheduled_cached_reqs entry for it is a KeyError.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, instances, run_groups, windowed_runs
-- columns: engine, step, req_id, details
WITH plain_suspects AS (
    -- A plain id (run_groups) is one request instance listed in every step from its first to its
    -- last: it is listed after its free only if its last step is, and only those ids' rows are
    -- read here; the other ids' rows come from the window (reading every row cost far more).
    SELECT g.engine, g.req_id, i.intro_step, i.freed_step
    FROM run_groups g
    JOIN instances i ON i.inst = g.inst
    WHERE g.plain AND i.freed_step < g.last_step
),
hits AS (
    SELECT s.engine, s.step, s.req_id, p.intro_step, p.freed_step
    FROM scheduled s
    JOIN plain_suspects p ON p.engine = s.engine AND p.req_id = s.req_id
    WHERE s.kind IN ('cached', 'resumed') AND p.freed_step < s.step
    UNION ALL
    SELECT i.engine, w.step, i.req_id, i.intro_step, i.freed_step
    FROM windowed_runs w
    JOIN instances i ON i.inst = w.inst
    WHERE w.kind IN ('cached', 'resumed') AND i.freed_step < w.step
)
SELECT engine, step, req_id,
       'freed by finished_req_ids at step ' || CAST(freed_step AS VARCHAR)
       || ', introduced at step ' || CAST(intro_step AS VARCHAR) AS details
FROM hits
