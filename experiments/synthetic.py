r"""The main job on the synthetic corpus: ANDREA's sixteen source names, sixteen invented languages.

  python -m andrea_jax.main --config=experiments/synthetic.py --workdir=runs/synthetic

``experiments/tiny.py``'s model, optimizer and length over ANDREA's own sixteen sources, on the
synthetic built-in corpus (``data.corpus = "synthetic"``: text generated from a fixed seed, no
vocabulary shared between sources, equal sizes, one pure-noise source ``extra-06`` and one
memorisable source ``repo-docs``), with ANDREA's three regimes scaled to the run: the seven warmup
sources for the first 10%, all sixteen until 56%, then the polish (repo-docs and repo-docstrings
at 0, hermes3-general >= 0.7, dictionary <= 0.25), as the 200K-step run does at 20K and 112,619.
The tests and the mixing study run on this corpus: it is fast to build at any scale and its
sources are known by construction. Conclusions drawn on it about warmup or mixing need not transfer
to real text (``experiments/tiny.py`` is the real-text demo).

One regime alone for the whole run: ``--config=experiments/synthetic.py:v3_polish`` (or
``v2_warmup``, ``v2_firehose``).

Hardware and expectations: those of ``experiments/tiny.py``; the held-out mean loss falls from
ln(257) = 5.55 nats/byte to about 2.
"""

import pathlib

from andrea_jax.config import load_config_file, with_sources
from andrea_jax.curriculum import andrea_geometries, single_geometry
from andrea_jax.sources import SOURCES


def get_config(geometry: str | None = None):
  """The main job over ANDREA's sixteen synthetic sources; with ``geometry``, that region of
  ANDREA's curriculum from step 0 to the end."""
  c = load_config_file(pathlib.Path(__file__).with_name("tiny.py"))   # the main job
  num_steps = c.train.num_steps
  geometries = andrea_geometries(num_steps, scale=num_steps / 200_000)
  if geometry:
    geometries = single_geometry(geometries, geometry)
  c = with_sources(c, SOURCES, geometries=geometries)
  c.data.corpus = "synthetic"
  c.eval.prompts = ("The ", "Q: ", "def ")
  return c
