"""The bash blocks of docs/ but configs.md (``tests/test_docs_manual.py``), lifecycle.md and
architecture.md (``tests/test_docs_walkthroughs.py``), run as ``tests/test_docs.py`` runs the
README's (see there)."""

import pytest

from tests.test_docs import REPO, blocks, run_block

PAGES = sorted(p for p in (REPO / "docs").glob("*.md")
               if p.name not in ("configs.md", "lifecycle.md", "architecture.md"))


@pytest.mark.slow
@pytest.mark.parametrize("where,commands", blocks(PAGES), ids=[w for w, _ in blocks(PAGES)])
def test_documented_block_runs(where, commands, tmp_path, data_cache):
  run_block(where, commands, tmp_path)
