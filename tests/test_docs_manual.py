"""The bash blocks of docs/, run as ``tests/test_docs.py`` runs the README's (see there)."""

import pytest

from tests.test_docs import REPO, blocks, run_block

MANUAL = sorted((REPO / "docs").glob("*.md"))


@pytest.mark.slow
@pytest.mark.parametrize("where,commands", blocks(MANUAL), ids=[w for w, _ in blocks(MANUAL)])
def test_documented_block_runs(where, commands, tmp_path, data_cache):
  run_block(where, commands, tmp_path)
