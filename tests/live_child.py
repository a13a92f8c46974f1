"""A real vLLM `LLM` (tiny model, CPU) driven from the live-recording tests, in its own process.

Recording is whatever the environment says (VLLM_CONTRACT_TRACE_DIR / VLLM_CONTRACT_ARM, read by
the installed plugin); the process never touches the recorder itself. vLLM spawns its engine core,
so this module needs the __main__ guard.

    python live_child.py MODEL RESULTS once NAME N [EXIT]   generate N requests, write
                                                            RESULTS/NAME.json, exit with EXIT
    python live_child.py MODEL RESULTS serve                then read "NAME N" lines from stdin,
                                                            one generate() per line; "exit" ends
    python live_child.py MODEL RESULTS twice NAME N         the same requests twice, into
                                                            RESULTS/NAME-1.json and NAME-2.json
    python live_child.py MODEL RESULTS demo NAME            the demo's workload (chunked prefill,
                                                            preemption, aborts): RESULTS/NAME.json
    options: --greedy (every request greedy, so that two runs can be compared);
             --no-prefix-cache (the second of two runs computes exactly what the first did);
             --user-async-scheduler (a subclass of AsyncScheduler as scheduler_cls);
             --batch-queue (in-process only: the engine steps with step_with_batch_queue);
             --devfull (once the engine has started recording, every future segment file of
             its trace is a symlink to /dev/full: the disk is full from the first rotation on)

Each results file maps vLLM's request id to its generated token ids; it is written atomically
after generate() returns. vLLM logs to stdout, so nothing else is printed for the tests to parse.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PATH = str(Path(__file__).resolve())


def child_env(mp: bool, **extra) -> dict:
    """This process's environment for a child engine: no recorder settings of ours but the
    shared cache, multiprocess mode as asked, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_CONTRACT_")
           or k == "VLLM_CONTRACT_CACHE"}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if mp else "0"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(llm, results: Path, name: str, n: int, seed: int, greedy: bool = False) -> None:
    from vllm_contract.rig.engine import params
    from vllm_contract.rig.scenarios import prompt

    prompts = [{"prompt_token_ids": prompt(seed + i, 60 + 37 * i)} for i in range(n)]
    # Random sampling without a seed (see test_fidelity_engine.py): equality within a run only.
    sampling = [params(24 + 8 * i, temperature=0.0 if greedy or i % 2 else 0.8) for i in range(n)]
    out = llm.generate(prompts, sampling, use_tqdm=False)
    tokens = {r.request_id: list(r.outputs[0].token_ids) for r in out}
    tmp = results / f".{name}.tmp"
    tmp.write_text(json.dumps(tokens))
    os.replace(tmp, results / f"{name}.json")


def _user_scheduler():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    class UserAsyncScheduler(AsyncScheduler):
        """What a user passes as --scheduler-cls: a subclass with its own schedule()."""

        def schedule(self, *args, **kwargs):
            return super().schedule(*args, **kwargs)

    return UserAsyncScheduler


def use_batch_queue(llm) -> None:
    """The step path that async scheduling and pipeline parallelism use (two batches in
    flight). The CPU platform turns async scheduling off, so the engine is switched over here,
    before its first step."""
    import collections

    core = llm.llm_engine.engine_core.engine_core
    core.batch_queue_size = 2
    core.batch_queue = collections.deque(maxlen=2)
    core.step_fn = core.step_with_batch_queue


def plant_devfull(trace_root: Path) -> None:
    from vllm_contract import schema

    (engine,) = (trace_root / schema.ENGINES_DIR).glob(schema.ENGINE_DIR_PREFIX + "*")
    for table in schema.TABLE_NAMES:
        for k in range(1, 1000):
            p = schema.table_dir(engine, table) / f"{k:06d}{schema.SEGMENT_SUFFIX}"
            if not p.exists():
                p.symlink_to("/dev/full")


def main() -> None:
    from vllm_contract.rig.demo import DEMO_ENGINE
    from vllm_contract.rig.engine import make_llm

    flags = {a for a in sys.argv if a.startswith("--")}
    args = [a for a in sys.argv if not a.startswith("--")]
    model, results, mode = args[1], Path(args[2]), args[3]
    greedy = "--greedy" in flags
    options = dict(DEMO_ENGINE)
    if "--no-prefix-cache" in flags:
        options["enable_prefix_caching"] = False
    if "--user-async-scheduler" in flags:
        options["scheduler_cls"] = _user_scheduler()
    llm = make_llm(model, **options)
    if "--batch-queue" in flags:
        use_batch_queue(llm)
    if "--devfull" in flags:
        plant_devfull(Path(os.environ["VLLM_CONTRACT_TRACE_DIR"]))
    (results / "ready").write_text(str(os.getpid()))
    if mode == "twice":
        run(llm, results, args[4] + "-1", int(args[5]), 0, greedy)
        run(llm, results, args[4] + "-2", int(args[5]), 0, greedy)
        return
    if mode == "demo":
        from vllm_contract.rig.engine import demo_workload

        tokens = demo_workload(llm)
        tmp = results / f"{args[4]}.json.tmp"
        tmp.write_text(json.dumps(tokens))
        tmp.replace(results / f"{args[4]}.json")
        return
    if mode == "once":
        run(llm, results, args[4], int(args[5]), 0, greedy)
        if len(args) > 6:
            sys.exit(int(args[6]))
        return
    seed = 0
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "exit":
            break
        run(llm, results, words[0], int(words[1]), seed, greedy)
        seed += 100


if __name__ == "__main__":
    main()
