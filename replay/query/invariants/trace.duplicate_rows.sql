-- id: trace.duplicate_rows
-- severity: error
-- title: rows repeated in a table whose rows are unique
-- why: The recorder writes each step, each request of a step and each finish once: a repeat
--      is a segment copied or written twice, and every count, sum and lifecycle check over it
--      is off (a step listed twice is two schedule() calls the engine never made).
-- relies_on: vllm_contract recorder (one row per step, per request of a step, per finish)
-- needs: steps (if present), updates (if present), requests (if present),
--        finished (if present), preempted (if present), finish_events (if present),
--        transport (if present)
-- columns: engine, step, req_id (NULL), details
-- note: repeats in scheduled and model_outputs, the largest tables, too costly to group by
--      request (a copied scheduled segment shows as tokens.duplicate_request)
WITH dup AS (
    SELECT engine, 'steps' AS tbl, 'step' AS key_cols, step, COUNT(*) - 1 AS extra
    FROM steps GROUP BY engine, step HAVING COUNT(*) > 1
    UNION ALL
    SELECT engine, 'updates' AS tbl, 'step' AS key_cols, step, COUNT(*) - 1 AS extra
    FROM updates GROUP BY engine, step HAVING COUNT(*) > 1
    UNION ALL
    SELECT engine, 'requests' AS tbl, 'step, req_id' AS key_cols, step, COUNT(*) - 1 AS extra
    FROM requests GROUP BY engine, step, req_id HAVING COUNT(*) > 1
    UNION ALL
    SELECT engine, 'finished' AS tbl, 'step, req_id' AS key_cols, step, COUNT(*) - 1 AS extra
    FROM finished GROUP BY engine, step, req_id HAVING COUNT(*) > 1
    UNION ALL
    SELECT engine, 'preempted' AS tbl, 'step, req_id' AS key_cols, step, COUNT(*) - 1 AS extra
    FROM preempted GROUP BY engine, step, req_id HAVING COUNT(*) > 1
    UNION ALL
    SELECT engine, 'finish_events' AS tbl, 'step, req_id, reason, source, t_ns' AS key_cols,
           step, COUNT(*) - 1 AS extra
    FROM finish_events GROUP BY engine, step, req_id, reason, source, t_ns HAVING COUNT(*) > 1
    UNION ALL
    SELECT engine, 'transport' AS tbl, 'step, event, worker, seq, t_ns' AS key_cols,
           step, COUNT(*) - 1 AS extra
    FROM transport GROUP BY engine, step, event, worker, seq, t_ns HAVING COUNT(*) > 1
)
SELECT engine, MIN(step) AS step, CAST(NULL AS VARCHAR) AS req_id,
       tbl || ': ' || CAST(SUM(extra) AS VARCHAR) || ' row(s) repeat another with the same '
       || key_cols || ', from step ' || CAST(MIN(step) AS VARCHAR) AS details
FROM dup
GROUP BY engine, tbl, key_cols
