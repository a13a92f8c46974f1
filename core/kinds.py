"""Every kind of finding that is not a catalog check: the shadow worker's, the real worker's and
the replay's, with what a reader needs to act on one (the catalog's checks carry the same in
their SQL headers: replay/query/invariants/).

A new worker finding goes here: its id, severity and title, why it matters, the vLLM code that
relies on the contract it breaks, the catalog check that reports the same thing at the same
step and request (`check --worker` and the TUI then keep the catalog's alone), and whether
vLLM's worker raises there (a real-worker replay stops before such a step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm_contract.findings import Finding, by_step

_RUNNER = "vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states"


@dataclass(frozen=True)
class Kind:
    id: str
    severity: str
    title: str
    why: str
    relies_on: str
    same_as: str | None = None  # the catalog check saying the same at the same step and req
    crashes: bool = False  # vLLM's worker raises (or indexes out of its batch) here

    def finding(self, step: int | None, req_id: str | None, details: str,
                engine: str | None = None) -> Finding:
        return Finding(self.id, self.severity, step, req_id, details, engine, self.title)


KINDS = {k.id: k for k in [
    Kind("worker.unknown_cached", "error",
         "a cached request the worker does not hold (KeyError in _update_states)",
         "the worker looks the request up in its cache and raises a KeyError", _RUNNER,
         "lifecycle.unknown_cached", crashes=True),
    Kind("worker.unknown_scheduled", "error",
         "tokens scheduled for a request the worker does not hold in its batch",
         "the worker finds no row of its persistent batch for the request and computes "
         "nothing (or indexes out of the batch)",
         "vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_inputs",
         "tokens.unlisted_request", crashes=True),
    Kind("worker.resumed_without_table", "error",
         "a resumed request without a whole block table",
         "a resumed request's new_block_ids replace its table: None, or a table too short "
         "for its computed and scheduled tokens, fails an assertion or writes KV elsewhere",
         _RUNNER, "lifecycle.resumed_without_blocks", crashes=True),
    Kind("worker.stale_table_append", "error",
         "new blocks appended to the stale table of a preempted request",
         "blocks appended to a table the scheduler freed at the preemption: the request "
         "reads and writes KV in blocks it no longer owns", _RUNNER,
         "lifecycle.preempted_not_resumed"),
    Kind("worker.encoder_output_missing", "error",
         "an encoder output the worker must read is no longer cached",
         "the worker raises 'Encoder cache miss' when a scheduled window reads an encoder "
         "output freed or never computed",
         "vllm/v1/worker/gpu_model_runner.py GPUModelRunner._gather_mm_embeddings",
         "encoder.freed_while_needed", crashes=True),
    Kind("worker.block_shared", "error",
         "a block given to a request while another live request holds it",
         "two live requests write their KV into one block: each reads the other's",
         _RUNNER, "blocks.double_owner"),
    Kind("worker.output_order", "error",
         "the model output's request ids differ from the worker's persistent batch",
         "the scheduler maps sampled tokens to requests by the output's order: another order "
         "gives a request another's tokens",
         "vllm/v1/core/sched/scheduler.py Scheduler.update_from_output",
         "outputs.ids_mismatch"),
    Kind("worker.never_freed", "error",
         "a finished request's state is never freed in the worker",
         "the worker frees a request's cached state only when its id arrives in "
         "finished_req_ids: without it the state stays for the process's life",
         _RUNNER, "finished.leaked"),
    Kind("replay.token_divergence", "error",
         "the real worker sampled other tokens than the recorded ones",
         "the same SchedulerOutputs into the same model gave other tokens: the recorded run "
         "computed from another context than its SchedulerOutputs say (or its worker did)",
         "vllm/v1/worker/gpu_model_runner.py GPUModelRunner.execute_model"),
    Kind("replay.would_crash", "error", "a step the real worker would crash on",
         "the shadow worker says vLLM's worker raises at this step; it was not run",
         _RUNNER),
    Kind("replay.crash", "error", "the real worker crashed",
         "vLLM's worker raised (or its process died) on a recorded step",
         "vllm/v1/worker/gpu_model_runner.py GPUModelRunner.execute_model"),
]}

CRASHES = frozenset(k.id for k in KINDS.values() if k.crashes)


def without_repeats(catalog: list[Finding], worker: list[Finding],
                    key: Callable[[Finding], tuple] = by_step) -> list[Finding]:
    """The catalog's findings and the worker's, less each worker finding the catalog already
    reports at the same engine, step and request (its kind's `same_as`), in the order `key`
    (core/findings.py's `by_step` or `by_severity`)."""
    said = {(f.engine, f.step, f.req_id, f.invariant) for f in catalog}
    kept = [f for f in worker if (f.engine, f.step, f.req_id,
                                  getattr(KINDS.get(f.invariant), "same_as", None)) not in said]
    return sorted(catalog + kept, key=key)
