-- id: outputs.ids_mismatch
-- severity: error
-- title: the model output's request ids differ from the step's scheduled ids
-- why: update_from_output() indexes sampled tokens by req_id_to_index; a missing id drops that
--      request's token, an extra one is a request the scheduler did not run.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler.update_from_output
-- needs: scheduled, model_outputs, updates
-- columns: engine, step, req_id, details
WITH sched AS (
    SELECT engine, step, req_id FROM scheduled WHERE num_scheduled_tokens IS NOT NULL
),
updated AS (
    SELECT DISTINCT engine, step FROM updates
),
both_ AS (
    SELECT COALESCE(s.engine, m.engine) AS engine, COALESCE(s.step, m.step) AS step,
           COALESCE(s.req_id, m.req_id) AS req_id, s.req_id AS sched_id, m.req_id AS out_id
    FROM sched s
    FULL OUTER JOIN model_outputs m
         ON m.engine = s.engine AND m.step = s.step AND m.req_id = s.req_id
    WHERE s.req_id IS NULL OR m.req_id IS NULL
)
SELECT b.engine, b.step, b.req_id,
       CASE WHEN b.out_id IS NULL THEN 'scheduled but missing from the model output'
            ELSE 'in the model output but not scheduled' END AS details
FROM both_ b
JOIN updated u ON u.engine = b.engine AND u.step = b.step
