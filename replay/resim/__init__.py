"""`resim`: re-run a real vLLM Scheduler on a recorded trace and say, step by step, whether its
decisions come out the same (docs/resim.md).

`vllm_contract.replay.resim(trace, ...)` is both this package and the function: the package
object is made callable, because importing the package sets it as the `resim` attribute of
vllm_contract.replay, where it would otherwise hide the function of the same name."""

from __future__ import annotations

import sys
import types

from vllm_contract.replay.resim.core import ResimRun, StepResult, Summary
from vllm_contract.replay.resim.debug import Break, Pending
from vllm_contract.replay.resim.options import ResimOptions
from vllm_contract.replay.resim.prepare import resim
from vllm_contract.replay.resim.run import Resim
from vllm_contract.replay.resim.whatif_run import WhatIf

__all__ = ["Break", "Pending", "Resim", "ResimOptions", "ResimRun", "StepResult", "Summary",
           "WhatIf", "resim"]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs) -> ResimRun:
        return resim(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
