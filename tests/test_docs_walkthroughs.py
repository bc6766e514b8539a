"""The bash blocks of docs/lifecycle.md and docs/architecture.md (the two pages whose blocks walk a
whole path, several runs each), run as ``tests/test_docs.py`` runs the README's (see there); the
other pages' are in ``tests/test_docs_pages.py`` and ``tests/test_docs_manual.py`` (the test
workers balance by file)."""

import pytest

from tests.test_docs import REPO, blocks, run_block

PAGES = [REPO / "docs" / "lifecycle.md", REPO / "docs" / "architecture.md"]


@pytest.mark.slow
@pytest.mark.parametrize("where,commands", blocks(PAGES), ids=[w for w, _ in blocks(PAGES)])
def test_documented_block_runs(where, commands, tmp_path, data_cache):
  run_block(where, commands, tmp_path)
