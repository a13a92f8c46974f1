-- id: trace.unverified
-- severity: info
-- title: parts of the trace that carry nothing to verify them by
-- why: Checksums and commit-marker counts are what tell damaged or lost rows from a recording
--      that never held them. Segments recorded or compacted before vllm-contract wrote them
--      (format 1, the committed samples) carry neither, so trace.checksum and trace.lost_rows
--      cannot see damage there: a clean result says less than on a newer trace.
-- relies_on: vllm_contract trace format (Parquet page checksums, row counts per flush in the steps stream's commit markers)
-- needs: integrity
-- columns: engine, step (NULL), req_id (NULL), details
SELECT engine, CAST(NULL AS BIGINT) AS step, CAST(NULL AS VARCHAR) AS req_id, details
FROM integrity
WHERE kind = 'unverified'
