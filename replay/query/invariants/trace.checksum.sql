-- id: trace.checksum
-- severity: error
-- title: trace data fails its checksum
-- why: Bytes of a segment changed after the recorder wrote them (a disk, a copy, an edit): its
--      rows may hold values the scheduler never sent, so neither the findings over them nor
--      their absence can be trusted.
-- relies_on: vllm_contract trace format (a CRC-32 per stream batch, Parquet page checksums)
-- needs: integrity
-- columns: engine, step (NULL), req_id (NULL), details
-- note: segments written before checksums existed (no checksum to fail)
SELECT engine, CAST(NULL AS BIGINT) AS step, CAST(NULL AS VARCHAR) AS req_id,
       segment || ': ' || details AS details
FROM integrity
WHERE kind = 'checksum'
