-- id: trace.lost_rows
-- severity: error
-- title: rows the recorder wrote are gone from the trace
-- why: The recorder commits each flush by counting every table's rows in the steps stream
--      (its commit markers): a segment holding fewer rows than counted, a table's segment
--      that is gone, rows beside no steps segment, or rows under a partition no manifest
--      names were lost, moved or hidden after they were written, and every check over the
--      table sees a recording that never happened (a request never finished, never freed).
-- relies_on: vllm_contract trace format (row counts per flush in the steps stream's commit markers, one engine=NAME partition per manifest)
-- needs: integrity
-- columns: engine, step (NULL), req_id (NULL), details
-- note: compaction carries the markers into the steps Parquet; segments compacted before it
--      did carry none, and there only trace.count_mismatch compares the steps with the manifest
SELECT engine, CAST(NULL AS BIGINT) AS step, CAST(NULL AS VARCHAR) AS req_id,
       segment || ': ' || details AS details
FROM integrity
WHERE kind = 'lost'
