-- id: encoder.freed_while_needed
-- severity: error
-- title: an encoder output is freed while a scheduled request still reads it
-- why: The worker frees free_encoder_mm_hashes before it runs the step, and reads a cached
--      encoder output both in the step that computes it and in every later step whose scheduled
--      window overlaps the input's placeholder (each chunk of a prefill that spans an image): a
--      read after the free is "Encoder cache miss" in the model runner.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states /
--            _gather_mm_embeddings (get_mm_features_in_window, _get_encoder_output_from_cache)
-- needs: freed_mm, mm_inputs, scheduled
-- columns: engine, step, req_id, details
-- note: an input scheduled in scheduled_encoder_inputs of a step is needed from the step
--       before (the free of the step before it) through that step. A read by window alone needs
--       the output kept from the step after the one that last computed it for this request (the
--       worker frees, then computes, within one step), or from the request's introduction if it
--       never did (the output was cached already), through the read.
WITH with_inputs AS (
    -- only requests with multimodal inputs are read: DuckDB skips this join's other side when
    -- there are none
    SELECT s.engine, s.step, s.req_id, s.encoder_inputs, s.num_computed_tokens,
           s.num_scheduled_tokens
    FROM scheduled s
    JOIN (SELECT DISTINCT engine, req_id FROM mm_inputs) m
         ON m.engine = s.engine AND m.req_id = s.req_id
    WHERE s.num_scheduled_tokens IS NOT NULL OR s.encoder_inputs IS NOT NULL
),
intro AS (
    SELECT engine, req_id, step AS intro_step, pos, identifier, "offset", length,
           LEAD(step) OVER (PARTITION BY engine, req_id, pos ORDER BY step) AS next_intro_step
    FROM mm_inputs
),
reads AS (
    -- each (step, request, input) whose encoder output the worker reads in that step
    SELECT w.engine, w.step, w.req_id, i.identifier, i.intro_step,
           COALESCE(LIST_CONTAINS(w.encoder_inputs, i.pos), FALSE) AS computed
    FROM with_inputs w
    JOIN intro i ON i.engine = w.engine AND i.req_id = w.req_id
    WHERE w.step >= i.intro_step AND (i.next_intro_step IS NULL OR w.step < i.next_intro_step)
      AND (COALESCE(LIST_CONTAINS(w.encoder_inputs, i.pos), FALSE)
           OR (w.num_scheduled_tokens > 0
               AND i."offset" < w.num_computed_tokens + w.num_scheduled_tokens
               AND i."offset" + i.length > w.num_computed_tokens))
),
needs AS (
    SELECT engine, step, req_id, identifier, computed,
           CASE WHEN computed THEN step - 1
                ELSE COALESCE(1 + MAX(CASE WHEN computed THEN step END) OVER (
                         PARTITION BY engine, req_id, intro_step, identifier ORDER BY step
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), intro_step)
           END AS kept_from
    FROM reads
)
SELECT n.engine, n.step, n.req_id,
       CASE WHEN n.computed THEN 'needs ' ELSE 'reads (a chunk over its placeholder) ' END
       || n.identifier || ', freed at step ' || CAST(f.step AS VARCHAR) AS details
FROM needs n
JOIN freed_mm f ON f.engine = n.engine AND f.mm_hash = n.identifier
WHERE f.step >= n.kept_from AND f.step <= n.step
