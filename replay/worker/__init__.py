"""The replay engine: the `Worker` interface every replay worker implements (`base`) and the
kinds by name (`registry`); rebuilding SchedulerOutputs from a trace (`rebuild`, vLLM imported
lazily); the shadow worker (`shadow_worker` over the package `shadow`, pure Python: the worker
state the contract governs); the real vLLM worker (`vllm_worker`, `vllm_driver`),
the only vLLM importer of the reading side; and the canonical form both ends of a replay are
compared in."""
