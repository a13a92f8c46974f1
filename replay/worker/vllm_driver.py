"""Replay a trace into a real vLLM worker and compare its sampled tokens with the recorded ones.

The engine is built from the trace's manifest (plan.py) with its scheduler bypassed: each
recorded step's SchedulerOutput is rebuilt (rebuild.py) and given to the executor
(`execute_model`, then `sample_tokens` when the step samples), the calls vLLM's own EngineCore
makes, so the same code drives the CPU and the CUDA builds. The executor must live in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0); its workers may be its children (tensor parallel).

Teacher forcing (`force=True`) writes the recorded tokens over the sampled ones in the worker's
request state after each step, where vLLM's model runner caches them (`_bookkeeping_sync`), so
that later steps see the recorded context. Going back re-runs from the first step: one empty
step frees every request the worker holds, then the steps run again (the cost of the steps
replayed; vLLM's worker state cannot be checkpointed).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from vllm_contract.errors import TraceError
from vllm_contract.replay.worker.base import Divergence
from vllm_contract.replay.worker.plan import Plan
from vllm_contract.replay.worker.warmup import Ledger, warmup_steps, why_not


def _runner(worker: Any) -> Any:
    inner = getattr(worker, "worker", None) or worker
    return inner.model_runner


def _held(worker: Any) -> dict[str, dict]:
    """The requests the model runner caches, as plain data."""
    return {rid: {"num_computed_tokens": int(st.num_computed_tokens),
                  "output_token_ids": [int(t) for t in st.output_token_ids]}
            for rid, st in _runner(worker).requests.items()}


def _force(worker: Any, tokens: dict[str, tuple[int, list[int]]]) -> list[str]:
    """Write recorded tokens over the `n` just sampled for each request, where the model runner
    caches them; returns the ids it could not reach."""
    runner = _runner(worker)
    batch = getattr(runner, "input_batch", None)
    if batch is None or not hasattr(batch, "token_ids_cpu"):
        raise TraceError(f"--force-recorded-tokens needs vLLM's v1 model runner layout "
                         f"(input_batch.token_ids_cpu); {type(runner).__name__} has none")
    missed = []
    for rid, (n, want) in tokens.items():
        state = runner.requests.get(rid)
        idx = batch.req_id_to_index.get(rid)
        if state is None or idx is None:
            missed.append(rid)
            continue
        end = int(batch.num_tokens_no_spec[idx])
        start = end - n
        batch.token_ids_cpu[idx, start:start + len(want)] = want
        batch.is_token_ids[idx, start:start + len(want)] = True
        batch.num_tokens_no_spec[idx] = start + len(want)
        out = state.output_token_ids
        out[len(out) - n:] = want
    return missed


# Engines built here, by their settings, kept for the life of the process: a replay engine
# that is dropped tears down vLLM's process-wide parallel state, which every other engine in
# the process (the one being recorded, the next replay's) still needs.
_BUILT: dict[str, Any] = {}


def build_llm(plan: Plan) -> Any:
    """A vLLM engine as the manifest describes, with enough KV blocks for the trace (the same
    one again for the same settings)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    options = {**plan.options, "kv_cache_memory_bytes": _kv_bytes(plan)}
    key = json.dumps(options, sort_keys=True, default=str)
    if key not in _BUILT:
        from vllm import LLM

        _BUILT[key] = LLM(**options)
    llm = _BUILT[key]
    check_llm(llm, plan)
    return llm


def _kv_bytes(plan: Plan) -> int:
    """Memory for the planned block count (K and V of every layer), so that the engine does not
    size its cache from free memory (slow to start, and a CPU takes most of the machine)."""
    from pathlib import Path

    try:
        cfg = json.loads((Path(plan.model) / "config.json").read_text())
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return 1 << 30
    size = 4 if plan.options.get("dtype") == "float32" else 2
    per_block = 2 * layers * heads * dim * size * int(plan.options.get("block_size") or 16)
    return max(per_block * plan.kv_blocks * 2, 16 << 20)


def _engine_core(llm: Any) -> Any:
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is None:
        raise TraceError("the replay engine's core runs in another process: set "
                         "VLLM_ENABLE_V1_MULTIPROCESSING=0")
    return core


def check_llm(llm: Any, plan: Plan) -> None:
    """The engine must hold every recorded block id (an id past the end is not bounds-checked
    on CPU: the worker segfaults or hangs) and use the recorded block size."""
    cfg = _engine_core(llm).vllm_config.cache_config
    blocks = cfg.num_gpu_blocks or 0
    if blocks < plan.kv_blocks:
        raise TraceError(f"the replay engine has {blocks} KV blocks; the trace uses ids up to "
                         f"{plan.kv_blocks - 1}")
    want = plan.options.get("block_size")
    if want and cfg.block_size != want:
        raise TraceError(f"the replay engine's block size is {cfg.block_size}, the trace's "
                         f"{want}")


class VllmDriver:
    """Feeds a vLLM executor one engine's recorded steps (a Plan's) and compares the tokens it
    samples; VllmWorker (vllm_worker.py) puts it behind the Worker interface."""

    def __init__(self, plan: Plan, llm: Any = None, force: bool = False) -> None:
        from vllm_contract.replay.worker.rebuild import rebuild

        self.plan = plan
        self.force = force
        self.rebuilt = rebuild(plan.engine)
        if self.rebuilt.drift:
            raise TraceError(f"the installed vLLM {self.rebuilt.installed_version} differs from "
                             f"the trace's ({plan.engine.manifest.get('vllm_version')}): "
                             f"{'; '.join(self.rebuilt.drift)}; replay with the vLLM that "
                             "recorded it (or --worker shadow)")
        self.llm = llm if llm is not None else build_llm(plan)
        if llm is not None:
            check_llm(llm, plan)
        core = _engine_core(self.llm)
        self.executor = core.model_executor
        self.block_size = int(core.vllm_config.cache_config.block_size)
        self.budget = int(core.vllm_config.scheduler_config.max_num_batched_tokens)
        self.recorded = self._recorded(plan.engine)
        # steps whose update_from_output() was recorded: only there is the model output known
        # (the last batch of a recording may not have been answered)
        self.answered = set(plan.engine.read("updates", ["step"]).column("step").to_pylist())
        self.pos = 0
        self.divergences: list[Divergence] = []
        self.last: dict[str, tuple[list[int] | None, list[int] | None]] = {}
        self._it = iter(())
        self._greedy = None  # SamplingParams of warm-up prefills, made when first needed
        self.reset()

    @property
    def steps(self) -> list[int]:
        return self.plan.steps

    @property
    def done(self) -> bool:
        return self.pos >= len(self.steps)

    @staticmethod
    def _recorded(engine) -> dict[int, dict[str, list[int]]]:
        out: dict[int, dict[str, list[int]]] = {}
        for r in engine.read("model_outputs", ["step", "req_id", "sampled_token_ids"]).to_pylist():
            out.setdefault(r["step"], {})[r["req_id"]] = list(r["sampled_token_ids"] or [])
        return out

    def reset(self) -> None:
        """Free everything the worker holds: the state of a fresh worker, without a restart."""
        from vllm.v1.core.sched.output import SchedulerOutput

        self.ledger = Ledger(self.block_size)
        held = self.executor.collective_rpc(_held)[0]
        if held:
            empty = SchedulerOutput.make_empty()
            empty.finished_req_ids = set(held)
            self._execute(empty)
        wanted = set(self.steps)
        self._it = ((s, so) for s, so in self.rebuilt if s in wanted)
        self.pos = 0
        self.divergences = []
        self.last = {}
        self.not_comparable = dict(self.plan.not_comparable)
        self.warmed: dict[str, int] = {}  # req_id -> prefix tokens prefilled before its step

    def _execute(self, so: Any) -> Any:
        out = self.executor.execute_model(so)
        if out is None:
            out = self.executor.sample_tokens(None)
        self.ledger.apply(so)
        return out

    def _warm(self, step: int, so: Any) -> None:
        """Fill the prefix-cache hits of this step's requests that the replay never computed
        (see warmup.py), or name those requests not comparable."""
        for r in so.scheduled_new_reqs:
            hit = int(r.num_computed_tokens)
            if hit <= 0 or not self.ledger.missing(r.block_ids, hit):
                continue
            why = why_not(r)
            if why is not None:
                self.not_comparable.setdefault(r.req_id, (
                    f"starts from {hit} prefix-cached tokens the replay never computed, and "
                    f"{why}"))
                continue
            if self._greedy is None:
                from vllm import SamplingParams

                self._greedy = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
            for warm in warmup_steps(r, self.budget, self._greedy):
                self._execute(warm)
            self.warmed[r.req_id] = hit
        c = so.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            if rid not in (getattr(c, "resumed_req_ids", None) or ()):
                continue
            hit = int(c.num_computed_tokens[i])
            new = c.new_block_ids[i] if i < len(c.new_block_ids) else None
            if hit > 0 and self.ledger.missing(new, hit):
                self.not_comparable.setdefault(rid, (
                    f"resumed at step {step} on {hit} prefix-cached tokens the replay never "
                    "computed"))

    def step(self) -> list[Divergence]:
        """Run the next recorded step; its token divergences."""
        step, so = next(self._it)
        if step != self.steps[self.pos]:
            raise TraceError(f"step {self.steps[self.pos]} could not be rebuilt (got {step})")
        self._warm(step, so)
        out = self._execute(so)
        got = {}
        if out is not None and out.req_ids:
            got = {rid: list(t) for rid, t in zip(out.req_ids, out.sampled_token_ids)}
        want = self.recorded.get(step, {})
        found, forced, self.last = [], {}, {}
        if step not in self.answered:
            self.last = {rid: (None, g) for rid, g in got.items()}
            self.pos += 1
            return found
        for rid in sorted(set(want) | {r for r, t in got.items() if t}):
            w, g = want.get(rid), got.get(rid)
            self.last[rid] = (w, g)
            if self.force and w is not None and g is not None and (w or g):
                forced[rid] = (len(g), w)
            if rid in self.not_comparable or (w or []) == (g or []):
                continue
            found.append(Divergence(step, rid, w, g))
        if forced:
            self.executor.collective_rpc(_force, args=(forced,))
        self.divergences.extend(found)
        self.pos += 1
        return found

    def run(self, until: int | None = None, progress: Callable[[int, int], None] | None = None,
            cancel: Callable[[], bool] | None = None, stop_at: Callable[[list], bool] | None = None
            ) -> bool:
        """Steps up to position `until` (default: the end); False if cancelled."""
        end = len(self.steps) if until is None else min(until, len(self.steps))
        while self.pos < end:
            if cancel is not None and cancel():
                return False
            found = self.step()
            if progress is not None:
                progress(self.pos, end)
            if stop_at is not None and stop_at(found):
                return True
        return True

    def goto(self, pos: int, progress=None, cancel=None) -> bool:
        if pos < self.pos:
            self.reset()
        return self.run(pos, progress, cancel)

    def state(self) -> dict:
        """What the worker holds at this position, and the last step's recorded against replayed
        tokens, as plain data."""
        held = self.executor.collective_rpc(_held)[0]
        step = self.steps[self.pos - 1] if self.pos else None
        return {"position": self.pos, "step": step, "held": dict(sorted(held.items())),
                "tokens": {rid: {"recorded": w, "replayed": g,
                                 "comparable": rid not in self.not_comparable}
                           for rid, (w, g) in self.last.items()},
                "divergences": [d.to_dict() for d in self.divergences if d.step == step]}
