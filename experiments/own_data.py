r"""The main job on your own sources: names of your choosing, data from your files.

  python -m andrea_jax.main --config=experiments/own_data.py:code,docs,reference \
      --workdir=runs/mine \
      --config.data.files.code.paths='/data/code/*.jsonl' \
      --config.data.files.docs.paths='/data/docs/*.txt' --config.data.files.docs.format=text \
      --config.data.files.reference.format=hf --config.data.files.reference.dataset=/data/ref_ds

The argument after ``:`` names the sources, comma-separated, in the order of every weight vector
(letters, digits, ``-`` and ``_``; on the command line a ``-`` is written ``_``). The run samples
from them on the whole simplex over them, no floor, no ceiling. With ``:andrea`` after the names
(``own_data.py:code,docs,reference:andrea``) it follows ANDREA's curriculum over them instead
(:func:`andrea_jax.curriculum.three_regimes`, at ANDREA's fractions of the run): a warmup on the
first half of the names, the firehose, then a polish with a floor of 0.7 on the first name and the
last one excluded. Order the names accordingly, or override any geometry's fields
(``--config.curriculum.geometries.polish.floors.docs=0.5``).

Everything else is ``experiments/tiny.py``'s main job: the model, optimizer, curriculum mixer
and run length. A source with neither files nor a dataset stops the run before anything compiles,
with every such source named.
"""

import pathlib

from andrea_jax.config import load_config_file, with_sources
from andrea_jax.curriculum import three_regimes

_GEOMETRIES = ("simplex", "andrea")


def get_config(spec: str | None = None):
  """The main job over the sources ``names[:simplex|andrea]`` (comma-separated names), from
  files."""
  names, _, geometries = (spec or "").partition(":")
  names = [n.strip() for n in names.split(",") if n.strip()]
  if not names:
    raise ValueError("experiments/own_data.py needs your sources' names after a colon: "
                     "--config=experiments/own_data.py:code,docs,reference")
  if geometries not in ("",) + _GEOMETRIES:
    raise ValueError(f"experiments/own_data.py:{spec}: after the names comes one of "
                     f"{_GEOMETRIES}, got {geometries!r}")
  c = load_config_file(pathlib.Path(__file__).with_name("tiny.py"))   # the main job
  num_steps = c.train.num_steps
  regimes = None
  if geometries == "andrea":
    if len(names) < 3:
      raise ValueError(f"experiments/own_data.py:{spec}: ANDREA's curriculum needs at least 3 "
                       "sources (a warmup subset, a polish target, one excluded)")
    regimes = three_regimes(num_steps, sources=names, warmup=names[:(len(names) + 1) // 2],
                            floors={names[0]: 0.7}, exclude=names[-1:])
  c = with_sources(c, names, geometries=regimes)
  c.data.corpus = "files"
  return c
