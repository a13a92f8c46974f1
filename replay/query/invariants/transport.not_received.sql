-- id: transport.not_received
-- severity: error
-- title: a step handed to the executor that a worker never received
-- why: The engine believes the step ran; the worker never saw its diff, so its cached state has
--      drifted from the scheduler's: the next cached entries refer to state it lacks.
-- relies_on: vllm/v1/executor/multiproc_executor.py MultiprocExecutor.execute_model
-- needs: transport
-- columns: engine, step, req_id (NULL), details
-- note: only for engines whose workers record receipts; the last executed step may still be
--       in flight and is not reported.
WITH receiving AS (
    SELECT engine, MAX(seq) AS last_seq FROM transport WHERE event = 'received' GROUP BY engine
),
received AS (
    SELECT DISTINCT engine, seq FROM transport WHERE event = 'received'
)
SELECT x.engine, x.step, CAST(NULL AS VARCHAR) AS req_id,
       'hand-off ' || CAST(x.seq AS VARCHAR) || ' never received by a worker' AS details
FROM transport x
JOIN receiving r ON r.engine = x.engine
LEFT JOIN received v ON v.engine = x.engine AND v.seq = x.seq
WHERE x.event = 'executed' AND v.seq IS NULL AND x.seq < r.last_seq
