-- id: trace.unclean_close
-- severity: warning
-- title: the trace was not closed cleanly
-- why: The recording process died: the last steps may be missing, and end-of-trace checks
--      (abandoned requests) are not run.
-- relies_on: vllm_contract recorder (manifest closed_cleanly)
-- needs: engines
-- columns: engine, step (NULL), req_id (NULL), details
-- note: a trace whose recorder still writes it (engines.recording: it holds the writer's lock)
--       is not reported: a live trace is normal, and the command says so once on stderr.
SELECT engine, CAST(NULL AS BIGINT) AS step, CAST(NULL AS VARCHAR) AS req_id,
       'not closed cleanly' || CASE WHEN recorder_errors > 0
           THEN ' (' || CAST(recorder_errors AS VARCHAR) || ' recorder error(s), see info)'
           ELSE '' END AS details
FROM engines
WHERE NOT closed_cleanly
  AND NOT recording
  AND stopped_error IS NULL  -- trace.recorder_stopped says more
