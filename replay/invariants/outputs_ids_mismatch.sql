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
outs AS (
    SELECT m.engine, m.step, m.req_id FROM model_outputs m
),
updated AS (
    SELECT DISTINCT engine, step FROM updates
)
SELECT s.engine, s.step, s.req_id, 'scheduled but missing from the model output' AS details
FROM sched s
JOIN updated u ON u.engine = s.engine AND u.step = s.step
LEFT JOIN outs o ON o.engine = s.engine AND o.step = s.step AND o.req_id = s.req_id
WHERE o.req_id IS NULL
UNION ALL
SELECT o.engine, o.step, o.req_id, 'in the model output but not scheduled' AS details
FROM outs o
LEFT JOIN sched s ON s.engine = o.engine AND s.step = o.step AND s.req_id = o.req_id
WHERE s.req_id IS NULL
