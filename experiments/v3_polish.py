r"""v3's polish region for the whole run: one regime of the ANDREA curriculum, alone.

  python -m andrea_jax.curriculum --config experiments/v3_polish.py --steps 20000 --out /tmp/sim

repo-docs and repo-docstrings excluded, hermes3-general >= 0.7, dictionary <= 0.25, and no warmup
restriction (``curriculum_warmup_steps = 0``).
The command simulates the curriculum (no model) against the synthetic reward model, in a few seconds
on a laptop CPU.
Expect ``weights.png`` to show hermes3-general at 0.7 or more at every step, repo-docs and
repo-docstrings at 0, dictionary at 0.25 or less.

As a training config it is ``andrea_jax.config.base_config()`` (the tiny model, 2000 steps) with the
curriculum restricted to this region:
``python -m andrea_jax.main --config=experiments/v3_polish.py --workdir=runs/v3_polish``.
"""

from andrea_jax import config as config_lib
from andrea_jax.curriculum import andrea_geometries, single_geometry


def get_config():
  c = config_lib.base_config()
  c.curriculum.geometries = single_geometry(andrea_geometries(), "v3_polish")
  return c
