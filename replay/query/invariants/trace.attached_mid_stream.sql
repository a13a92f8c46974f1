-- id: trace.attached_mid_stream
-- severity: info
-- title: the recording began while the engine was running
-- why: The worker already held requests introduced before the first recorded step; lifecycle
--      checks do not blame the scheduler for those.
-- relies_on: vllm_contract recorder (manifest attached_mid_stream)
-- needs: engines
-- columns: engine, step (NULL), req_id (NULL), details
SELECT engine, CAST(NULL AS BIGINT) AS step, CAST(NULL AS VARCHAR) AS req_id,
       'recording attached to a running engine' AS details
FROM engines
WHERE attached_mid_stream
