"""What a user reads of `check` and `replay` on the committed samples stays byte for byte what
it was: a restructuring that changes nothing a user sees must pass this unchanged. Each
command's stdout (its JSON) and exit status on every sample is compared whole with fixtures
generated from an earlier commit (tests/fixtures/outputs/SAMPLE/). A change meant to show users
something else regenerates them, and its commit says so:

    .venv/bin/python tests/layout/test_outputs_unchanged.py              # this checkout's code
    .venv/bin/python tests/layout/test_outputs_unchanged.py --commit REV # the code of commit REV

Nothing is normalised: the outputs hold nothing of the machine that runs them (no path, pid or
time; `engine` is the name the sample's recording gave its engine, the same in every clone).
The commands run in-process, as the `vllm-contract` script runs them, which keeps this fast."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
FIXTURES = ROOT / "tests" / "fixtures" / "outputs"
STATUS = "exit-status.json"  # beside the outputs: {command: exit code}
REGENERATE = ".venv/bin/python tests/layout/test_outputs_unchanged.py"

COMMANDS = {
    "check": ["check", "{trace}", "--format", "json"],
    "check-shadow": ["check", "{trace}", "--worker", "shadow", "--format", "json"],
    "replay": ["replay", "{trace}", "--format", "json"],
}


def samples() -> list[str]:
    return sorted(p.name for p in SAMPLES.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "__")))


def run(sample: str, command: str):
    """The command on the sample: (stdout bytes, exit code, the exception that escaped)."""
    from typer.testing import CliRunner

    from vllm_contract.cli import app

    args = [a.format(trace=SAMPLES / sample) for a in COMMANDS[command]]
    r = CliRunner().invoke(app, args)
    escaped = None if r.exc_info is None or r.exc_info[0] is SystemExit else r.exc_info
    return r.stdout_bytes, r.exit_code, escaped


def _with_fixtures() -> list[str]:
    """Every sample, and every sample fixtures were made of (one since removed fails)."""
    made = {p.name for p in FIXTURES.iterdir() if p.is_dir()} if FIXTURES.is_dir() else set()
    return sorted(set(samples()) | made)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("sample", _with_fixtures())
def test_output_is_unchanged(sample, command):
    fixture = FIXTURES / sample / f"{command}.json"
    assert (SAMPLES / sample).is_dir(), (
        f"fixtures of a sample that is gone: remove {fixture.parent.relative_to(ROOT)}")
    assert fixture.is_file(), f"no fixture for samples/{sample}: run `{REGENERATE}`"
    out, code, escaped = run(sample, command)
    if escaped is not None:
        import traceback

        pytest.fail("".join(traceback.format_exception(*escaped)))
    want = fixture.read_bytes()
    if out != want:
        diff = difflib.unified_diff(want.decode().splitlines(), out.decode().splitlines(),
                                    str(fixture.relative_to(ROOT)), "now", lineterm="")
        line = " ".join(COMMANDS[command]).format(trace=f"samples/{sample}")
        pytest.fail(f"`vllm-contract {line}` prints what it did not before:\n" +
                    "\n".join(list(diff)[:200]) +
                    f"\n\nIf users are meant to see this, regenerate: `{REGENERATE}`")
    status = json.loads((FIXTURES / sample / STATUS).read_text())
    assert code == status[command], (
        f"exit {code}, was {status[command]}; if meant, regenerate: `{REGENERATE}`")


def _import_from(commit: str, into: Path) -> None:
    """Make `import vllm_contract...` load the package as it was at `commit`: its directories
    unpacked into `into`, ahead of the editable install on the import path."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import io
    import subprocess
    import tarfile
    import tomllib

    pyproject = tomllib.loads(subprocess.run(
        ["git", "show", f"{commit}:pyproject.toml"], cwd=ROOT, check=True,
        capture_output=True, text=True).stdout)
    dirs = pyproject["tool"]["setuptools"]["package-dir"]
    tar = subprocess.run(["git", "archive", commit, *sorted(set(dirs.values()))], cwd=ROOT,
                         check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    packages = {name: into / d for name, d in dirs.items()}

    class FromCommit(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name in packages:
                d = packages[name]
                return importlib.util.spec_from_file_location(
                    name, d / "__init__.py", submodule_search_locations=[str(d)])
            parent = name.rpartition(".")[0]
            if parent in packages:
                return importlib.machinery.PathFinder.find_spec(name, [str(packages[parent])])
            return None

    assert not [m for m in sys.modules if m.split(".")[0] == "vllm_contract"]
    sys.meta_path.insert(0, FromCommit())


def regenerate(commit: str | None = None) -> None:
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        if commit is not None:
            _import_from(commit, Path(tmp))
        import vllm_contract.cli

        print(f"the code: {Path(vllm_contract.cli.__file__).parent.parent}", file=sys.stderr)
        shutil.rmtree(FIXTURES, ignore_errors=True)
        for sample in samples():
            status = {}
            for command in COMMANDS:
                out, code, escaped = run(sample, command)
                status[command] = int(code)
                if escaped is not None:
                    raise escaped[1]
                (FIXTURES / sample).mkdir(parents=True, exist_ok=True)
                (FIXTURES / sample / f"{command}.json").write_bytes(out)
            (FIXTURES / sample / STATUS).write_text(json.dumps(status, indent=2) + "\n")
            print(f"{sample}: {status}", file=sys.stderr)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="Regenerate tests/fixtures/outputs/.")
    p.add_argument("--commit", help="generate them with the code of this commit (default: the "
                   "checkout's code); the samples are the checkout's")
    regenerate(p.parse_args().commit)
