-- id: encoder.freed_while_needed
-- severity: error
-- title: an encoder output is freed while a scheduled request still reads it
-- why: The worker frees free_encoder_mm_hashes before it runs the step, and reads a cached
--      encoder output both in the step that computes it and in every later step whose scheduled
--      window overlaps the input's placeholder (each chunk of a prefill that spans an image): a
--      read after the free is "Encoder cache miss" in the model runner. A drafter that takes
--      multimodal embeddings (eagle, eagle3, MTP, dflash, dspark, a draft model) reads again
--      after the target, one token ahead; under async scheduling the worker has by then lowered
--      num_computed_tokens by the previous step's rejected drafts, so that window can start
--      behind the target's, and a miss there is the same error.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states /
--            _gather_mm_embeddings (get_mm_features_in_window, _get_encoder_output_from_cache);
--            propose_draft_token_ids (_gather_mm_embeddings with shift_computed_tokens=1) after
--            _update_states' deferred correct_spec_decode_token_counts
-- needs: freed_mm, mm_inputs, scheduled, engines, model_outputs (if present)
-- columns: engine, step, req_id, details
-- note: an input scheduled in scheduled_encoder_inputs of a step is needed from the step
--       before (the free of the step before it) through that step. A read by window alone needs
--       the output kept from the step after the one that last computed it for this request (the
--       worker frees, then computes, within one step), or from the request's introduction if it
--       never did (the output was cached already), through the read. The drafter's window is
--       [nc - r + 1, nc - r + 1 + count), r the drafts of the step before less the ones its
--       output accepted (one fewer than it sampled); the worker corrects only a cached row that
--       was in that step's batch, and only with async scheduling, and it tolerates a miss of an
--       input that starts at nc - r + count or later. Below r = 2 the drafter reads nothing the
--       target does not, so only r >= 2 adds reads. The corrected count is what the request
--       really has computed, at least its prompt once it decodes, so that window starts past
--       the prompt: no placeholder inside the prompt is reached. Not modelled: a drafter that
--       does not run (input_fits_in_drafter), and mamba_cache_mode 'align', which corrects
--       before the target's gather as well.
WITH mm_reqs AS (
    SELECT DISTINCT engine, req_id FROM mm_inputs
),
with_inputs AS (
    -- only requests with multimodal inputs are read: DuckDB skips this join's other side when
    -- there are none (their drafts come from here too, not from a second pass over the lists)
    SELECT s.engine, s.step, s.req_id, s.kind, s.encoder_inputs, s.num_computed_tokens,
           s.num_scheduled_tokens, s.spec_token_ids
    FROM scheduled s
    JOIN mm_reqs m ON m.engine = s.engine AND m.req_id = s.req_id
    WHERE s.num_scheduled_tokens IS NOT NULL OR s.encoder_inputs IS NOT NULL
),
shifts AS (
    -- the rows whose worker lowers num_computed_tokens by at least 2 rejected drafts before
    -- the drafter's gather: keyed by the step after the drafts, whose batch the row was in
    SELECT p.engine, p.step + 1 AS step, p.req_id,
           CARDINALITY(p.spec_token_ids) + 1 - CARDINALITY(o.sampled_token_ids) AS rejected
    FROM with_inputs p
    JOIN engines e ON e.engine = p.engine
    JOIN model_outputs o ON o.engine = p.engine AND o.step = p.step AND o.req_id = p.req_id
    WHERE e.async_scheduling
      AND (e.spec_method IN ('eagle', 'eagle3', 'dflash', 'dspark', 'draft_model')
           OR e.spec_method LIKE '%mtp')
      AND p.spec_token_ids IS NOT NULL AND p.num_scheduled_tokens IS NOT NULL
      AND o.sampled_token_ids IS NOT NULL AND CARDINALITY(o.sampled_token_ids) > 0
      AND CARDINALITY(p.spec_token_ids) + 1 - CARDINALITY(o.sampled_token_ids) >= 2
),
shifted AS (
    SELECT w.engine, w.step, w.req_id, w.encoder_inputs, w.num_computed_tokens,
           w.num_scheduled_tokens, h.rejected
    FROM with_inputs w
    LEFT JOIN shifts h ON h.engine = w.engine AND h.step = w.step AND h.req_id = w.req_id
                      AND w.kind = 'cached'
),
intro AS (
    SELECT engine, req_id, step AS intro_step, pos, identifier, "offset", length,
           LEAD(step) OVER (PARTITION BY engine, req_id, pos ORDER BY step) AS next_intro_step
    FROM mm_inputs
),
reads AS (
    -- each (step, request, input) whose encoder output the worker reads in that step
    SELECT w.engine, w.step, w.req_id, i.identifier, i.intro_step, w.rejected,
           COALESCE(LIST_CONTAINS(w.encoder_inputs, i.pos), FALSE) AS computed,
           CASE WHEN COALESCE(LIST_CONTAINS(w.encoder_inputs, i.pos), FALSE) THEN FALSE
                WHEN w.num_scheduled_tokens > 0
                     AND i."offset" < w.num_computed_tokens + w.num_scheduled_tokens
                     AND i."offset" + i.length > w.num_computed_tokens THEN FALSE
                ELSE TRUE END AS by_drafter
    FROM shifted w
    JOIN intro i ON i.engine = w.engine AND i.req_id = w.req_id
    WHERE w.step >= i.intro_step AND (i.next_intro_step IS NULL OR w.step < i.next_intro_step)
      AND (COALESCE(LIST_CONTAINS(w.encoder_inputs, i.pos), FALSE)
           OR (w.num_scheduled_tokens > 0
               AND i."offset" < w.num_computed_tokens + w.num_scheduled_tokens
               AND i."offset" + i.length > w.num_computed_tokens)
           OR (w.rejected IS NOT NULL AND w.num_scheduled_tokens > 0
               AND i."offset" < w.num_computed_tokens - w.rejected + w.num_scheduled_tokens
               AND i."offset" + i.length > w.num_computed_tokens - w.rejected + 1))
),
needs AS (
    SELECT engine, step, req_id, identifier, computed, by_drafter, rejected,
           CASE WHEN computed THEN step - 1
                ELSE COALESCE(1 + MAX(CASE WHEN computed THEN step END) OVER (
                         PARTITION BY engine, req_id, intro_step, identifier ORDER BY step
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), intro_step)
           END AS kept_from
    FROM reads
)
SELECT n.engine, n.step, n.req_id,
       CASE WHEN n.computed THEN 'needs '
            WHEN n.by_drafter THEN 'reads (the drafter, after ' || CAST(n.rejected AS VARCHAR)
                                   || ' rejected drafts) '
            ELSE 'reads (a chunk over its placeholder) ' END
       || n.identifier || ', freed at step ' || CAST(f.step AS VARCHAR) AS details
FROM needs n
JOIN freed_mm f ON f.engine = n.engine AND f.mm_hash = n.identifier
WHERE f.step >= n.kept_from AND f.step <= n.step
