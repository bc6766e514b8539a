r"""v2's firehose region for the whole run: one regime of the ANDREA curriculum, alone.

  python -m andrea_jax.curriculum --config experiments/v2_firehose.py --steps 20000 --out /tmp/sim

All sixteen sources, no floor, no ceiling: the full 15-D simplex.
The command simulates the curriculum (no model) against the synthetic reward model, in a few seconds
on a laptop CPU.
Expect ``weights.png`` to show all sixteen sources, bandit phases moving the mass toward the sources
whose synthetic loss falls fastest per token, random phases spreading it again.

As a training config it is ``andrea_jax.config.base_config()`` (the tiny model, 2000 steps) with the
curriculum restricted to this region:
``python -m andrea_jax.main --config=experiments/v2_firehose.py --workdir=runs/v2_firehose``.
"""

from andrea_jax import config as config_lib
from andrea_jax.curriculum import andrea_geometries, single_geometry


def get_config():
  c = config_lib.base_config()
  c.curriculum.geometries = single_geometry(andrea_geometries(), "v2_firehose")
  return c
