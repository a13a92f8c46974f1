"""A built-in check's file is named by its id (`invariants/<id>.sql`): the docs link each
check's source by that name, and a check copied to a new file under an old id would otherwise
load as the old one's twin."""

from __future__ import annotations

import pytest

from vllm_contract.errors import TraceError
from vllm_contract.replay.query import catalog

HEADER = """-- id: {id}
-- severity: error
-- title: a check
-- why: a test
-- relies_on: nothing
-- needs: steps
SELECT engine, step, NULL AS req_id, 'x' AS details FROM steps
"""


def test_every_builtin_check_is_named_by_its_id():
    checks = catalog.load()
    assert checks and all(i.path.stem == i.id for i in checks)


def test_a_builtin_check_named_otherwise_is_refused_naming_its_file(tmp_path, monkeypatch):
    (tmp_path / "mine.good.sql").write_text(HEADER.format(id="mine.good"))
    (tmp_path / "mine.renamed.sql").write_text(HEADER.format(id="mine.original"))
    monkeypatch.setattr(catalog, "BUILTIN_DIR", tmp_path)
    with pytest.raises(TraceError) as e:
        catalog.load()
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'mine.renamed.sql'}: malformed check")
    assert "mine.original.sql" in msg and "\n" not in msg


def test_a_users_check_may_be_named_as_its_author_likes(tmp_path):
    (tmp_path / "x.sql").write_text(HEADER.format(id="mine.anything"))
    assert [i.id for i in catalog.load([tmp_path], builtin=False)] == ["mine.anything"]
