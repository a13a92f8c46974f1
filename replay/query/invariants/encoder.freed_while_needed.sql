-- id: encoder.freed_while_needed
-- severity: error
-- title: an encoder output is freed while a request scheduled in the same or next step needs it
-- why: The worker frees free_encoder_mm_hashes before it runs the step; a request that still
--      reads that encoder output gets a missing-key error or recomputes nothing.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states / _gather_mm_embeddings
-- needs: freed_mm, mm_inputs, scheduled
-- columns: engine, step, req_id, details
WITH with_inputs AS (
    -- only requests with multimodal inputs are read: DuckDB skips this join's other side when
    -- there are none, but not a scan filtered on encoder_inputs or an UNNEST of every row's list
    -- (0.4 s at a million steps); UNNEST drops the rows without inputs below
    SELECT s.engine, s.step, s.req_id, s.encoder_inputs
    FROM scheduled s
    JOIN (SELECT DISTINCT engine, req_id FROM mm_inputs) m
         ON m.engine = s.engine AND m.req_id = s.req_id
),
wanted AS (
    SELECT engine, step, req_id, UNNEST(encoder_inputs) AS input_pos
    FROM with_inputs
),
intro AS (
    SELECT engine, req_id, step AS intro_step, pos, identifier,
           LEAD(step) OVER (PARTITION BY engine, req_id, pos ORDER BY step) AS next_intro_step
    FROM mm_inputs
),
needs AS (
    SELECT w.engine, w.step, w.req_id, i.identifier
    FROM wanted w
    JOIN intro i ON i.engine = w.engine AND i.req_id = w.req_id AND i.pos = w.input_pos
    WHERE w.step >= i.intro_step AND (i.next_intro_step IS NULL OR w.step < i.next_intro_step)
)
SELECT n.engine, n.step, n.req_id,
       'needs ' || n.identifier || ', freed at step ' || CAST(f.step AS VARCHAR) AS details
FROM needs n
JOIN freed_mm f ON f.engine = n.engine AND f.mm_hash = n.identifier
WHERE f.step = n.step OR f.step = n.step - 1
