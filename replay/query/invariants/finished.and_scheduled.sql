-- id: finished.and_scheduled
-- severity: error
-- title: an id is in finished_req_ids and scheduled as cached in the same step
-- why: The worker frees finished ids first, then looks the cached request up: KeyError. (An id
--      finished and re-introduced as new in one step is id reuse, and fine.)
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
-- needs: scheduled, finished, run_groups, windowed_runs, run_ids
-- columns: engine, step, req_id, details
WITH plain_hits AS (
    -- A plain id (run_groups) is listed in every step from its first to its last, and cached
    -- after its first row: a finished id meets one of its cached or resumed rows exactly when the
    -- step is in that span (its first step too, unless that row is new). Only the other ids'
    -- rows are joined one by one (joining every row cost far more).
    SELECT f.engine, f.step, f.req_id
    FROM finished f
    JOIN run_groups g ON g.engine = f.engine AND g.req_id = f.req_id
    WHERE g.plain AND f.step >= g.first_step AND f.step <= g.last_step
      AND (f.step > g.first_step OR g.first_kind <> 'new')
),
windowed AS (
    SELECT k.engine, w.step, k.req_id
    FROM windowed_runs w
    JOIN run_ids k ON k.inst = w.inst
    WHERE w.kind IN ('cached', 'resumed')
),
hits AS (
    SELECT engine, step, req_id FROM plain_hits
    UNION ALL
    SELECT f.engine, f.step, f.req_id
    FROM finished f
    JOIN windowed w ON w.engine = f.engine AND w.step = f.step AND w.req_id = f.req_id
)
SELECT engine, step, req_id,
       'in finished_req_ids and scheduled_cached_reqs of the same step' AS details
FROM hits
