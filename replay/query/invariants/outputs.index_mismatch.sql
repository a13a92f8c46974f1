-- id: outputs.index_mismatch
-- severity: error
-- title: the model output's req_id_to_index disagrees with its req_ids
-- why: update_from_output() takes each request's sampled tokens at req_id_to_index[req_id], not
--      at the id's place in req_ids: a map that disagrees hands one request another's tokens
--      (silently wrong output), or raises KeyError for an id it lacks. The recorder keeps the
--      map (extra_fields, field req_id_to_index) only when it is not req_ids enumerated.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler.update_from_output
-- needs: extra_fields, model_outputs
-- columns: engine, step, req_id, details
WITH maps AS (
    SELECT engine, step, value_json FROM extra_fields
    WHERE owner = 'ModelRunnerOutput' AND field = 'req_id_to_index'
),
pairs AS (
    SELECT m.engine, m.step, t.k AS req_id,
           CAST(json_extract(m.value_json, '$."' || t.k || '"') AS BIGINT) AS idx
    FROM maps m, unnest(json_keys(m.value_json)) AS t(k)
),
outs AS (
    SELECT o.engine, o.step, o.req_id, o.pos
    FROM model_outputs o
    JOIN maps m ON m.engine = o.engine AND m.step = o.step
)
SELECT p.engine, p.step, p.req_id,
       'req_id_to_index gives ' || CAST(p.idx AS VARCHAR) || ', req_ids has it '
       || COALESCE('at ' || CAST(o.pos AS VARCHAR), 'nowhere') AS details
FROM pairs p
LEFT JOIN outs o ON o.engine = p.engine AND o.step = p.step AND o.req_id = p.req_id
WHERE o.pos IS DISTINCT FROM p.idx
UNION ALL
SELECT o.engine, o.step, o.req_id,
       'in req_ids at ' || CAST(o.pos AS VARCHAR) || ', missing from req_id_to_index' AS details
FROM outs o
WHERE NOT EXISTS (SELECT 1 FROM pairs p
                  WHERE p.engine = o.engine AND p.step = o.step AND p.req_id = o.req_id)
