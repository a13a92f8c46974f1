"""`vllm-contract contract` on the installed vLLM (0.32.0, its real dataclasses): against the
seed excerpt of vLLM's source, a trace it recorded, and field-set files edited from its own
dump to stand for another version (the only way to show a change with one vLLM installed: the
edits are named as such)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.fields import WITH_COLUMN

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / ".." / "shared" / "seeds"


def _run(*args: str):
    return CliRunner().invoke(app, ["contract", *args])


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    r = _run("--dump")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _edited(tmp_path: Path, dump: dict, edit) -> str:
    """A field-set file as another vLLM would have it: the installed one's, edited."""
    d = json.loads(json.dumps(dump))
    edit(d["classes"])
    d["source"] = "an edited dump"
    path = tmp_path / "fields.json"
    path.write_text(json.dumps(d))
    return str(path)


def test_the_dump_has_every_class_and_every_field_with_a_column(dump):
    import dataclasses

    from vllm.v1.core.sched.output import SchedulerOutput

    classes = dump["classes"]
    assert set(classes) == {"SchedulerOutput", "NewRequestData", "CachedRequestData",
                            "ModelRunnerOutput", "Request"}
    assert list(classes["SchedulerOutput"]) == [f.name for f in dataclasses.fields(
        SchedulerOutput)]
    assert classes["SchedulerOutput"]["finished_req_ids"] == "set[str]"
    assert "request_id" in classes["Request"] and "self" not in classes["Request"]


def test_against_the_seed_excerpt_nothing_breaks_and_what_it_lacks_is_said(dump):
    # the excerpt beside the checkout where there is one, else the copy read from it
    r = _run("--against", "seed", "--format", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["breaking"] == 0 and "ef9339e" in out["before"]
    kinds = {c["kind"] for c in out["changes"]}
    assert kinds <= {"beyond the source"}  # the excerpt's fields are all there, same types
    beyond = {c["name"] for c in out["changes"]}
    # what the excerpt (it ends inside SchedulerOutput) cannot show is every later field
    later = list(dump["classes"]["SchedulerOutput"])
    assert beyond == set(later[later.index("free_encoder_mm_hashes") + 1:])


def test_without_against_it_is_the_seed():
    assert _run().stdout == _run("--against", "seed").stdout


@pytest.fixture(scope="module")
def recorded(tiny_model, tmp_path_factory):
    from vllm_contract.rig import scenarios

    path = tmp_path_factory.mktemp("contract") / "t"
    scenarios.run("aborts", tiny_model, path)
    return path


def _edit_manifest(src: Path, dst: Path, edit) -> str:
    import shutil

    shutil.copytree(src, dst)
    (m,) = dst.glob("_engines/*/manifest.json")
    manifest = json.loads(m.read_text())
    edit(manifest)
    m.write_text(json.dumps(manifest))
    return str(dst)


def test_a_new_trace_records_every_class_with_types_so_its_request_is_compared(
        recorded, dump, tmp_path):
    r = _run("--against", str(recorded), "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["changes"] == [], r.output
    (m,) = recorded.glob("_engines/*/manifest.json")
    assert json.loads(m.read_text())["field_types"] == dump["classes"]

    def edit(m):  # a version whose Request took no cache_salt: an argument resim gives
        del m["field_types"]["Request"]["cache_salt"]
        m["field_types"]["SchedulerOutput"]["finished_req_ids"] = "list[str]"

    r = _run("--against", _edit_manifest(recorded, tmp_path / "older", edit), "-f", "json")
    assert r.exit_code == 1, r.output
    changes = {(c["cls"], c["name"]): c for c in json.loads(r.stdout)["changes"]}
    assert changes[("Request", "cache_salt")]["kind"] == "added"
    assert changes[("SchedulerOutput", "finished_req_ids")]["kind"] == "type changed"


def test_a_field_set_the_real_worker_refuses_is_rated_as_breaking_replay(recorded, tmp_path):
    """The same edit, a NewRequestData field the installed vLLM lacks (as another version's
    trace would have it), rated by `contract` and refused by the real worker."""
    def edit(m):
        m["fields"]["NewRequestData"].append("a_future_field")
        m["field_types"]["NewRequestData"]["a_future_field"] = "int"

    other = _edit_manifest(recorded, tmp_path / "other", edit)
    r = _run("--against", other, "--format", "json")
    assert r.exit_code == 1, r.output
    (change,) = json.loads(r.stdout)["changes"]
    assert change["kind"] == "removed" and change["breaks"] == ["replay"]
    r = CliRunner().invoke(app, ["replay", other, "--worker", "vllm"])
    assert r.exit_code == 2, r.output
    assert "NewRequestData lacks a_future_field" in r.stderr and "Traceback" not in r.output


def test_against_a_trace_it_recorded_there_is_no_change():
    r = _run("--against", str(ROOT / "samples" / "mixed"))
    assert r.exit_code == 0, r.output
    assert "0 change(s), 0 breaking something here" in r.stdout


def test_the_seed_copy_is_what_the_excerpt_format_reads_to(tmp_path):
    """The reader of a numbered excerpt, on lines in its format (written here, not vLLM's), and
    the built-in copy against the excerpt itself where the checkout has it beside it."""
    from vllm_contract.replay import contract

    (tmp_path / "x.txt").write_text(
        "vllm/vllm/v1/core/sched/output.py · ef9339e · L245–279 · pinned\n\n"
        "245class SchedulerOutput:\n246    # a comment: not a field\n"
        + "".join(f"{247 + i}    {n}: {t}\n" for i, (n, t) in enumerate(
            contract.seed_copy().classes["SchedulerOutput"].items()))
        + "279    # the excerpt ends inside the class\n")
    got = contract.from_seed(tmp_path / "x.txt")
    assert got.classes == contract.seed_copy().classes
    assert got.partial == contract.seed_copy().partial
    if SEEDS.is_dir():
        real = contract.from_seed(sorted(SEEDS.glob("*.txt"))[0])
        assert real.classes == contract.seed_copy().classes


def test_a_change_is_classified_and_rated_by_what_it_breaks(dump, tmp_path):
    def edit(c):
        # the other version: finished_req_ids typed as a list, resumed_req_ids under its old
        # name, an opaque field and a field with no column it lacked, one it had that is gone
        c["SchedulerOutput"]["finished_req_ids"] = "list[str]"
        cached = c["CachedRequestData"]
        cached["resumed_from_preemption"] = cached.pop("resumed_req_ids")
        del c["SchedulerOutput"]["kv_connector_metadata"]
        c["NewRequestData"]["old_field"] = "int"
        c["ModelRunnerOutput"] = {k: v for k, v in c["ModelRunnerOutput"].items()
                                  if k in WITH_COLUMN["ModelRunnerOutput"]}

    path = _edited(tmp_path, dump, edit)
    r = _run("--against", path, "--format", "json")
    assert r.exit_code == 1, r.output  # something breaks
    changes = {(c["cls"], c["name"]): c for c in json.loads(r.stdout)["changes"]}
    typed = changes[("SchedulerOutput", "finished_req_ids")]
    assert typed["kind"] == "type changed" and typed["before"] == "list[str]"
    assert set(typed["breaks"]) == {"recording", "replay", "resim"}
    renamed = changes[("CachedRequestData", "resumed_from_preemption")]
    assert renamed["kind"] == "renamed" and renamed["after"] == "resumed_req_ids"
    # the recorder knows the new name, and keeps what it has no column for: only the real
    # worker, which refuses a trace whose field set differs from the installed classes', breaks
    assert renamed["breaks"] == ["replay"] and "the real worker refuses" in renamed["why"]
    opaque = changes[("SchedulerOutput", "kv_connector_metadata")]
    assert opaque["kind"] == "added" and opaque["breaks"] == ["replay"]
    assert "opaque" in opaque["why"]
    gone = changes[("NewRequestData", "old_field")]
    assert gone["kind"] == "removed" and gone["breaks"] == ["replay"]
    added = [c for (cls, _), c in changes.items() if cls == "ModelRunnerOutput"]
    assert added and all(c["kind"] == "added" and c["breaks"] == [] for c in added)
    # the same as GitHub annotations: an error for what breaks, a notice for the rest
    r = _run("--against", path, "--format", "github")
    lines = r.stdout.splitlines()
    assert r.exit_code == 1
    assert any(x.startswith("::error title=vLLM contract::SchedulerOutput.finished_req_ids")
               for x in lines)
    assert any(x.startswith("::error title=vLLM contract::CachedRequestData."
                            "resumed_from_preemption renamed to resumed_req_ids; breaks replay")
               for x in lines)
    assert any(x.startswith("::notice title=vLLM contract::ModelRunnerOutput.") for x in lines)
    r = _run("--against", path, "--format", "markdown")
    assert "| SchedulerOutput | `finished_req_ids` | type `list[str]` → `set[str]` |" in r.stdout


def test_a_rename_is_known_either_way(dump, tmp_path):
    """A newer vLLM's field set against an older installed one: the installed class is edited
    to stand for the older vLLM (the field under its old name), the file is the real dump."""
    from vllm_contract.replay import contract

    newer = contract.from_json(Path(_edited(tmp_path, dump, lambda c: None)))
    older = contract.from_json(Path(_edited(tmp_path, dump, lambda c: c["CachedRequestData"]
                                            .update(resumed_from_preemption=c[
                                                "CachedRequestData"].pop("resumed_req_ids")))))
    (change,) = contract.diff(newer, older)
    assert (change.kind, change.name, change.after) == (
        "renamed", "resumed_req_ids", "resumed_from_preemption")
    # the recorder reads resumed_req_ids only: under the older vLLM its column stays empty
    assert change.breaks == ["recording", "check", "replay", "resim"]
    assert "the recorder reads resumed_req_ids, not resumed_from_preemption" in change.why


def test_a_removed_field_with_a_column_breaks_what_reads_it(dump, tmp_path):
    def edit(c):  # the other version had a field of ours the installed one lacks
        c["SchedulerOutput"]["pretend_column"] = "int"

    from vllm_contract.replay import contract

    before = contract.from_json(Path(_edited(tmp_path, dump, edit)))
    after = contract.installed()
    # a look-alike column: the rating reads core/fields.py's list, extended here
    WITH_COLUMN_SO = WITH_COLUMN["SchedulerOutput"]
    try:
        WITH_COLUMN["SchedulerOutput"] = (*WITH_COLUMN_SO, "pretend_column")
        (change,) = contract.diff(before, after)
    finally:
        WITH_COLUMN["SchedulerOutput"] = WITH_COLUMN_SO
    assert change.kind == "removed"
    assert change.breaks == ["recording", "check", "replay", "resim"]


def test_bad_input_is_one_line(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    for args, said in ((("--against", str(tmp_path / "nope")), "no such trace directory or file"),
                       (("--against", str(tmp_path / "bad.json")), "not a field-set file"),
                       (("--dump", "--against", "seed"), "give it without --against"),
                       ):
        r = _run(*args)
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
        assert said in r.stderr and "Traceback" not in r.output
