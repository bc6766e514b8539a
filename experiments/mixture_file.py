r"""The main job under a mixture schedule read from a JSON file (a mixture fitted elsewhere).

  python -m andrea_jax.main --config=experiments/mixture_file.py:fit.json --workdir=runs/fitted

The argument is the file (:mod:`andrea_jax.curriculum.mixture_file`): either a schedule, e.g. a
fitted mixture for the first half of the run, then uniform::

  {"schedule": [{"start": 0.0, "mixture": {"reference": 3, "docstrings": 2}}, {"start": 0.5}]}

or weights held in the main job's own geometries (``{"geometries": {"v2_firehose": {...}}}``).
Everything else is ``experiments/tiny.py``'s main job, under the static mixer (each part holds
its mixture; a part without one holds ``curriculum.mixer.mixture``, uniform). Another mixer
decides the parts without a mixture: ``--config.curriculum.mixer.name=elastic``. The weights become
config fields, recorded with each checkpoint and overridable like any other
(``--config.curriculum.geometries.part0.mixture.chat=1``).

Hardware and expectations: those of ``experiments/tiny.py``.
"""

import pathlib

from andrea_jax.config import load_config_file
from andrea_jax.curriculum import read_mixture_file, set_mixer


def get_config(path: str | None = None):
  """The main job under the mixture file ``path``."""
  if not path:
    raise ValueError("experiments/mixture_file.py needs the mixture file after a colon: "
                     "--config=experiments/mixture_file.py:fit.json")
  c = load_config_file(pathlib.Path(__file__).with_name("tiny.py"))   # the main job
  set_mixer(c, "static")
  c.curriculum.geometries = read_mixture_file(path, num_steps=c.train.num_steps,
                                              sources=c.sources,
                                              geometries=c.curriculum.geometries)
  return c
