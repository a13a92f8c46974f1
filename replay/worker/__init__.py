"""The replay engine: rebuilding SchedulerOutputs from a trace, the shadow worker (pure Python)
and the real-vLLM-worker driver (the only vLLM importer of the reading side, lazily). Today it
holds the canonical form both ends of a replay are compared in."""
