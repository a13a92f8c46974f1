"""The built wheel installs into a clean venv as one `vllm_contract` package and works without
vLLM: no stray top-level `core`/`cli`/`recorder`/`replay`/`tui`/`rig` packages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from vllm_contract.trace import open_trace
from vllm_contract.rig import scenarios

REPO = Path(__file__).resolve().parents[2]
MAPPED = {"core": "vllm_contract", "cli": "vllm_contract.cli", "recorder": "vllm_contract.recorder",
          "replay": "vllm_contract.replay", "tui": "vllm_contract.tui", "rig": "vllm_contract.rig"}
# every package of the source tree, found rather than listed: pyproject.toml names each one, and
# a subpackage it forgets is missing from the wheel only
SUBPACKAGES = sorted(
    ".".join([pkg, *d.relative_to(REPO / folder).parts])
    for folder, pkg in MAPPED.items()
    for d in [REPO / folder, *(i.parent for i in (REPO / folder).rglob("*/__init__.py"))])
FOLDERS = ["core", "cli", "recorder", "replay", "query", "worker", "tui", "rig"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def test_wheel_installs_one_namespace(tmp_path, tiny_model):
    # Build from a copy of the working tree, so that no build/ or egg-info lands in the repo.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".venv", ".cache", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        "demo-trace"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, src],
         cwd=tmp_path, timeout=300)
    (wheel,) = dist.glob("vllm_contract-*.whl")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", wheel], cwd=tmp_path, timeout=600)

    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path, timeout=60).stdout.strip())
    assert site.resolve().is_relative_to(env_dir.resolve())

    code = ("import importlib, json\n"
            f"print(json.dumps({{m: importlib.import_module(m).__file__ for m in {SUBPACKAGES!r}}}))")
    where = json.loads(_run([py, "-c", code], cwd=tmp_path, timeout=120).stdout)
    for mod, path in where.items():
        expected = site.resolve() / Path(*mod.split(".")) / "__init__.py"
        assert Path(path).resolve() == expected, (mod, path)

    installed = {p.name for p in site.iterdir()}
    assert "vllm_contract" in installed
    assert not installed & set(FOLDERS), sorted(installed & set(FOLDERS))
    top_level = next(site.glob("vllm_contract-*.dist-info")) / "top_level.txt"
    assert top_level.read_text().split() == ["vllm_contract"]
    # The replay package must not need vLLM (users bring their own build, or none at all).
    assert not list(site.glob("vllm-*.dist-info")) and not (site / "vllm").exists()

    # The installed console script reads a real trace, without vLLM in its environment.
    trace = tmp_path / "trace"
    scenarios.run("aborts", tiny_model, trace)
    want = open_trace(trace).read("steps").num_rows
    assert want > 0
    r = _run([env_dir / "bin" / "vllm-contract", "info", trace, "-f", "json"], cwd=tmp_path,
             timeout=120)
    assert json.loads(r.stdout)["engines"][0]["steps"] == want

    bad = subprocess.run([str(env_dir / "bin" / "vllm-contract"), "info", str(tmp_path / "nope")],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [f"vllm-contract: error: {tmp_path / 'nope'}: "
                                       "no such trace directory"]
    assert "Traceback" not in bad.stderr + bad.stdout
