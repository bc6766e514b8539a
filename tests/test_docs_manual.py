"""The bash blocks of docs/configs.md, run as ``tests/test_docs.py`` runs the README's (see there);
the other pages' are in ``tests/test_docs_pages.py`` (the test workers balance by file)."""

import pytest

from tests.test_docs import REPO, blocks, run_block

PAGES = [REPO / "docs" / "configs.md"]


@pytest.mark.slow
@pytest.mark.parametrize("where,commands", blocks(PAGES), ids=[w for w, _ in blocks(PAGES)])
def test_documented_block_runs(where, commands, tmp_path, data_cache):
  run_block(where, commands, tmp_path)
