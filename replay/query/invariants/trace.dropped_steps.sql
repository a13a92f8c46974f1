-- id: trace.dropped_steps
-- severity: warning
-- title: the recorder dropped steps (its writer fell behind)
-- why: Checks over a range with missing steps can neither see breaks there nor rule them out;
--      lifecycle findings next to a gap may be artefacts of the gap.
-- relies_on: vllm_contract recorder (max_pending)
-- needs: dropped
-- columns: engine, step, req_id (NULL), details
SELECT engine, first_step AS step, CAST(NULL AS VARCHAR) AS req_id,
       'steps ' || CAST(first_step AS VARCHAR) || '..' || CAST(last_step AS VARCHAR)
       || ' were not recorded' AS details
FROM dropped
