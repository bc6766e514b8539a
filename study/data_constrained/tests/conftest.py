"""The pieces cut once per session from the real ``stdlib`` corpus, and the arms pointed at them."""

import pytest

from andrea_jax.data.corpora import stdlib as sc
from study.data_constrained import arms, prep


@pytest.fixture(scope="session")
def corpus():
  return sc.stdlib_documents()


@pytest.fixture(scope="session")
def pieces_dir(tmp_path_factory, corpus):
  out = str(tmp_path_factory.mktemp("pieces"))
  prep.write(out, corpus)
  return out


@pytest.fixture
def study_pieces(pieces_dir, monkeypatch):
  """``arms.PIECES`` pointed at the session's pieces (both sizes: the configs only name files)."""
  monkeypatch.setitem(arms.PIECES, "32k", pieces_dir)
  monkeypatch.setitem(arms.PIECES, "8k", pieces_dir)
  return pieces_dir
