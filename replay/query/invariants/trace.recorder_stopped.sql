-- id: trace.recorder_stopped
-- severity: warning
-- title: the recording stopped early
-- why: A recorder error (a full disk, a bug of ours) ended the recording while the engine went
--      on: the steps after it are not in the trace, and nothing after them can be checked.
--      Readers see the trace up to the last flush that was whole on disk, so the stop itself
--      leaves no half step behind to be mistaken for a contract break.
-- relies_on: vllm_contract trace format (manifest `stopped`)
-- needs: engines
-- columns: engine, step, req_id (NULL), details
SELECT engine, stopped_after_step AS step, CAST(NULL AS VARCHAR) AS req_id,
       CASE WHEN stopped_after_step IS NULL THEN 'recording stopped before its first step'
            ELSE 'recording stopped after step ' || CAST(stopped_after_step AS VARCHAR) END
       || ': ' || stopped_error AS details
FROM engines
WHERE stopped_error IS NOT NULL
