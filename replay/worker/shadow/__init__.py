"""The shadow worker: a pure-Python model of the state vLLM's worker keeps (GPUModelRunner's
`_update_states`, the persistent batch of gpu_input_batch.py, `_gather_mm_embeddings`' encoder
reads), applied to a recorded trace one SchedulerOutput at a time. It reports, as findings in
`check`'s format (ids `worker.*`), where a real worker would raise or silently compute the
wrong thing. What it models and what it does not: docs/replay-shadow.md.

The modules, each using only those before it: segments (a table's segments, Parquet ones
with their string columns left dictionary-encoded), columns (one engine's tables as numpy
columns and lists), state (per request, per step, checkpoints), kernel (a chunk of steps'
changes, prepared with numpy), rules (the worker's rules; the full path), fast (the fast path),
model (ShadowModel and run_shadow).

pyarrow only: no vLLM, no DuckDB.
"""

from vllm_contract.replay.worker.shadow.model import ShadowModel, run_shadow

__all__ = ["ShadowModel", "run_shadow"]
