"""vllm-contract: record, check and replay the contract between vLLM's scheduler and workers."""

__version__ = "0.1.0"
