"""The replay engine: rebuilding SchedulerOutputs from a trace (`rebuild`, vLLM imported lazily),
the shadow worker (`shadow`, pure Python: the worker state the contract governs), and the
canonical form both ends of a replay are compared in. The real-vLLM-worker driver comes here
too, the only vLLM importer of the reading side."""
