r"""The main job on your own files: the curriculum over the sources you bring, and only those.

  python -m andrea_jax.main --config=experiments/own_data.py:hermes3-general,gutenberg \
      --workdir=runs/mine \
      --config.data.files.hermes3_general.paths='/data/hermes/*.jsonl' \
      --config.data.files.gutenberg.paths='/data/gutenberg/*.txt' \
      --config.data.files.gutenberg.format=text

The argument after ``:`` names the sources (comma-separated, the names of
``andrea_jax.sources.SOURCES``, with ``-`` or ``_``) that have files; the run samples from them alone, on the whole
simplex over them (no floor, no ceiling: ANDREA's three regions are written for all sixteen sources
and would give weight to the absent ones). Everything else is ``experiments/tiny.py``'s main job:
the model, optimizer, curriculum strategy and run length. A source named here without files, or
with files that hold no text, stops the run before anything compiles, with the source named.
"""

import pathlib

from andrea_jax.config import load_config_file
from andrea_jax.curriculum import geometry
from andrea_jax.sources import SOURCES


def get_config(sources: str | None = None):
  """The main job over ``sources`` (comma-separated names), read from files."""
  # The override paths spell sources with "_" (hermes3_general): accept that spelling too.
  keys = {s.replace("-", "_"): s for s in SOURCES}
  names = [keys.get(s.strip(), s.strip()) for s in (sources or "").split(",") if s.strip()]
  names = list(dict.fromkeys(names))   # a source named twice is meant once
  if not names:
    raise ValueError("experiments/own_data.py needs the sources you have files for, after a colon: "
                     "--config=experiments/own_data.py:hermes3-general,gutenberg")
  unknown = [s for s in names if s not in SOURCES]
  if unknown:
    raise ValueError(f"experiments/own_data.py: unknown source(s) {', '.join(map(repr, unknown))}; "
                     f"sources are: {', '.join(SOURCES)}")
  c = load_config_file(pathlib.Path(__file__).with_name("tiny.py"))   # the main job
  c.data.corpus = "files"
  c.curriculum.geometries = type(c.curriculum.geometries)()
  c.curriculum.geometries.own = geometry("own", 0, only=names)
  return c
