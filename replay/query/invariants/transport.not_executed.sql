-- id: transport.not_executed
-- severity: error
-- title: a step the scheduler produced was never handed to the executor
-- why: Whatever that step carried never reached a worker: finished ids stay cached in the worker
--      for good (the memory leak of a skipped zero-token step), new requests are never
--      introduced, and the scheduler already advanced its own state as if they had been.
-- relies_on: vllm/v1/engine/core.py EngineCore.step / step_with_batch_queue
-- needs: steps, transport
-- columns: engine, step, req_id (NULL), details
-- note: only for engines whose trace records the transport (live engines armed by the plugin);
--       the trace's last step may still be in flight and is not reported.
WITH tracked AS (
    SELECT engine, MAX(step) AS last_step
    FROM transport WHERE event = 'executed' GROUP BY engine
),
executed AS (
    SELECT DISTINCT engine, step FROM transport WHERE event = 'executed'
)
SELECT s.engine, s.step, CAST(NULL AS VARCHAR) AS req_id,
       'never executed: ' || CAST(s.total_num_scheduled_tokens AS VARCHAR) || ' tokens, '
       || CAST(s.num_new AS VARCHAR) || ' new, ' || CAST(s.num_finished AS VARCHAR)
       || ' finished ids' AS details
FROM steps s
JOIN tracked t ON t.engine = s.engine
LEFT JOIN executed x ON x.engine = s.engine AND x.step = s.step
WHERE x.step IS NULL AND s.step < t.last_step
