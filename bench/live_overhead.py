"""What live recording costs an engine (issue: live engines).

1. A live CPU engine: generated tokens per second with recording on ÷ off, for each writer
   (the writer process, and the writer thread: what an engine whose model runs on the CPU gets
   by default). One in-process `LLM`, armed exactly as the plugin arms an engine core (gate,
   executor hand-off counter, worker receipts) once per writer; turns of `generate()` of the
   same greedy batch (repeated so that a turn lasts at least --turn-seconds) rotate through
   unrecorded and each writer recording (order rotating too), each recorded turn ending with a
   flush barrier so that the writer's work is paid inside it. Two models: the tiny Llama of the
   tests (a step is mostly vLLM's own Python, the recorder's worst case) and a ~60M-parameter
   random Llama (a step nearer a real deployment's). Target ≥ 0.98.
2. The real Scheduler (harness, no model) at n running decode requests: steps per second with
   the plugin armed but not recording ÷ no plugin at all, on one scheduler whose blocks of
   steps alternate between armed and not. Target ≥ 0.995. Beside it, the gate measured alone:
   the extra time of one schedule() call through the armed gate, against the step time.

Usage: python bench/live_overhead.py [--models tiny small] [--writers process thread]
                                     [--turns 30] [--turn-seconds 1.5] [--reqs 16] [--tokens 128]
                                     [--harness-reqs 256] [--blocks 30] [--block-steps 50]
Prints markdown tables; paste them into bench/RESULTS.md with the date and machine.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
for _name in ("VLLM_CONTRACT_TRACE_DIR", "VLLM_CONTRACT_ARM"):  # no plugin, unless we arm
    os.environ.pop(_name, None)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_contract.recorder import plugin, settings  # noqa: E402
from vllm_contract.trace import open_trace  # noqa: E402
from vllm_contract.rig import tiny_model  # noqa: E402
from vllm_contract.rig.scenarios import prompt  # noqa: E402


# A larger random-weight Llama (about 60M parameters) for a step time nearer a real
# deployment's: on the tiny model a decode step is mostly vLLM's own Python, so whatever the
# recorder costs looks as large as it can.
SMALL = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
             num_key_value_heads=4, vocab_size=512, max_position_embeddings=512)
MODELS = {
    # name: (KV bytes per 128-token block, how to build it)
    "tiny": (64 << 10, None),
    "small": (128 * 8 * 2 * 4 * 64 * 2, SMALL),
}


def build_model(name: str) -> str:
    if MODELS[name][1] is None:
        return str(tiny_model.build())
    out = tiny_model.default_dir().with_name(f"bench-{name}-llama-v1")
    if (out / "done.json").exists():
        return str(out)
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.manual_seed(0)
    config = LlamaConfig(**MODELS[name][1], bos_token_id=1, eos_token_id=2,
                         torch_dtype="bfloat16")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    tiny_model.save_tokenizer(tmp)
    (tmp / "done.json").write_text(json.dumps(MODELS[name][1]))
    os.replace(tmp, out)
    return str(out)


def live_engine(name: str, turns: int, reqs: int, tokens: int, tmp: Path,
                writers: list[str], turn_s: float) -> list[dict]:
    """One engine, armed as the plugin arms it, once per writer (process, thread): each
    recording starts paused. Turns rotate through unrecorded and one recording per writer, the
    order rotating too. The same engine (weights, caches, threads) serves every side, so two
    engine instances' differences cannot pass for the recorder's cost. A paused recording still
    runs its gate and wrappers (a flag check each): every side pays all of those. Each recorded
    turn ends with a flush barrier: the writer's work for it is paid inside it."""
    from vllm_contract.rig.engine import make_llm, params

    model = build_model(name)
    llm = make_llm(model, kv_blocks=64, max_num_batched_tokens=512, max_num_seqs=reqs,
                   enable_prefix_caching=False, kv_cache_memory_bytes=64 * MODELS[name][0])
    core = llm.llm_engine.engine_core.engine_core
    armed = {w: plugin.arm_engine(core, core.scheduler, settings.Settings(
        trace_dir=str(tmp / name / w), writer_options={**settings.LIVE_DEFAULTS, "writer": w}),
        serve=False) for w in writers}
    recs = {w: a.recorder for w, a in armed.items()}
    for rec in recs.values():
        rec.pause()
    prompts = [{"prompt_token_ids": prompt(i, 64 + 16 * i)} for i in range(reqs)]
    sampling = params(tokens)
    llm.generate(prompts[:2], params(8), use_tqdm=False)  # warm up
    # A turn lasts at least turn_s (its generate() repeated): the flush barrier that ends a
    # recorded turn blocks the engine for one flush, which a running engine
    # pays once per flush interval (1 s) in the writer, never in its own thread.
    t0 = time.perf_counter()
    llm.generate(prompts, sampling, use_tqdm=False)
    rounds = max(1, math.ceil(turn_s / (time.perf_counter() - t0)))
    gc.collect()
    gc.freeze()
    # what a writer process spent starting (its imports) is not per step
    cpu0 = {w: writer_cpu_s(r.writer) for w, r in recs.items()}
    sides = ["off", *writers]
    times = {m: [] for m in sides}
    generated = {m: 0 for m in sides}
    for t in range(turns):
        for mode in sides[t % len(sides):] + sides[:t % len(sides)]:
            rec = recs.get(mode)
            if rec is not None:
                rec.resume()
            t0 = time.perf_counter()
            for _ in range(rounds):
                out = llm.generate(prompts, sampling, use_tqdm=False)
                generated[mode] += sum(len(r.outputs[0].token_ids) for r in out)
            if rec is not None:
                rec.pause()
                rec.flush()
            times[mode].append(time.perf_counter() - t0)
    gc.unfreeze()
    cpu = {w: writer_cpu_s(r.writer) - cpu0[w] for w, r in recs.items()}
    for a in reversed(armed.values()):  # the last armed wraps the others
        a.shutdown()
    results = []
    off = sum(times["off"])
    for w in writers:
        (e,) = open_trace(tmp / name / w).engines
        assert e.manifest["closed_cleanly"], e.manifest["recorder_errors"]
        assert generated[w] == generated["off"]
        steps = e.read("steps").num_rows
        on = sum(times[w])
        pairs = [a / b for a, b in zip(times["off"], times[w])]
        results.append({
            "model": name, "writer": w, "reqs": reqs, "rounds": rounds, "tokens": generated[w],
            "steps": steps,
            "writer_us_per_step": cpu[w] / steps * 1e6, "step_us": off / steps * 1e6,
            "tok_s_off": generated["off"] / off, "tok_s_on": generated[w] / on,
            "ratio": off / on, "pair_median": statistics.median(pairs),
            "best": min(times["off"]) / min(times[w]),
            "dropped": e.manifest.get("dropped_steps_total", 0)})
    return results


def thread_cpu_s(native_id: int) -> float:
    """CPU time (user + system) of one thread of this process, from /proc."""
    return _cpu_s(f"/proc/self/task/{native_id}/stat")


def _cpu_s(stat: str) -> float:
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def writer_cpu_s(writer) -> float:
    """CPU time of the writer: its thread, or its whole process."""
    proc = getattr(writer, "proc", None)
    if proc is not None:
        return _cpu_s(f"/proc/{proc.pid}/stat")
    return thread_cpu_s(writer._thread.native_id)


def harness_armed(model: str, n: int, blocks: int, block_steps: int) -> dict:
    """One real Scheduler under a steady decode load; blocks of steps alternate between the
    plugin's gate installed (armed, not recording) and no hook at all (the plugin absent), the
    order alternating too. Arming and disarming are instance-attribute swaps, done between
    blocks, outside the timing."""
    from recorder_overhead import decode_harness

    load = decode_harness(model, n)
    gc.collect()
    gc.freeze()
    times = {"absent": [], "armed": []}
    for b in range(blocks):
        for mode in (("absent", "armed") if b % 2 == 0 else ("armed", "absent")):
            armed = plugin.arm_engine(None, load.scheduler, settings.Settings(arm=True),
                                      serve=False) if mode == "armed" else None
            t0 = time.perf_counter()
            for _ in range(block_steps):
                load.step()
            times[mode].append(time.perf_counter() - t0)
            if armed is not None:
                assert armed.recorder is None
                armed.disarm()
    gc.unfreeze()
    absent, on = sum(times["absent"]), sum(times["armed"])
    pairs = [a / b for a, b in zip(times["absent"], times["armed"])]
    return {"reqs": n, "steps_s_absent": blocks * block_steps / absent,
            "steps_s_armed": blocks * block_steps / on, "ratio": absent / on,
            "pair_median": statistics.median(pairs),
            "best": min(times["absent"]) / min(times["armed"]),
            "step_us": absent / (blocks * block_steps) * 1e6}


def gate_cost_ns() -> float:
    """Extra nanoseconds per call that the armed gate adds to a method, measured on a no-op."""
    class Sched:
        def schedule(self):
            return None

        def has_requests(self):
            return False

    s = Sched()
    bare = s.schedule
    armed = plugin.arm_engine(None, s, settings.Settings(arm=True), serve=False)
    gated = s.schedule
    n = 2_000_000
    best = float("inf")
    for _ in range(5):
        t_bare = timeit.timeit(bare, number=n)
        t_gate = timeit.timeit(gated, number=n)
        best = min(best, (t_gate - t_bare) / n * 1e9)
    armed.disarm()
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["tiny", "small"], choices=list(MODELS))
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--turn-seconds", type=float, default=1.5)
    ap.add_argument("--writers", nargs="+", default=["process", "thread"],
                    choices=["process", "thread"])
    ap.add_argument("--reqs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--harness-reqs", type=int, nargs="+", default=[256])
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--block-steps", type=int, default=50)
    args = ap.parse_args()
    model = str(tiny_model.build())
    tmp = Path(tempfile.mkdtemp(prefix="vllm-contract-live-bench-"))
    try:
        print(f"# live recording overhead, {time.strftime('%Y-%m-%d')}, {platform.node()}, "
              f"{os.cpu_count()} cores, Python {platform.python_version()}", flush=True)
        print("\n| model | writer | turn: generate() × requests × tokens | steps recorded "
              "| µs per step | tokens/s off | tokens/s on | on ÷ off (target ≥ 0.98) "
              "| median of paired turns | best ÷ best | writer CPU µs per step | steps dropped |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name in args.models:
            for r in live_engine(name, args.turns, args.reqs, args.tokens, tmp, args.writers,
                                 args.turn_seconds):
                print(f"| {name} | {r['writer']} | {r['rounds']} × {r['reqs']} × {args.tokens} "
                      f"| {r['steps']} "
                      f"| {r['step_us']:.0f} | {r['tok_s_off']:.0f} | {r['tok_s_on']:.0f} | "
                      f"{r['ratio']:.3f} | {r['pair_median']:.3f} | {r['best']:.3f} | "
                      f"{r['writer_us_per_step']:.0f} | {r['dropped']} |", flush=True)
        gate = gate_cost_ns()
        print("\n| running reqs | µs per step | steps/s absent | steps/s armed | armed ÷ absent "
              "(target ≥ 0.995) | median of paired blocks | best ÷ best | gate alone: ns per "
              "step | 1 − gate ÷ step |")
        print("|---|---|---|---|---|---|---|---|---|")
        for n in args.harness_reqs:
            h = harness_armed(model, n, args.blocks, args.block_steps)
            print(f"| {n} | {h['step_us']:.0f} | {h['steps_s_absent']:.1f} | "
                  f"{h['steps_s_armed']:.1f} | {h['ratio']:.4f} | {h['pair_median']:.4f} | "
                  f"{h['best']:.4f} | {gate:.0f} | {1 - gate / (h['step_us'] * 1e3):.6f} |",
                  flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
