"""Everything that runs inside a vLLM process. vLLM is imported lazily, only when recording."""

from vllm_contract.recorder.attach import Recorder, attach

__all__ = ["Recorder", "attach"]
