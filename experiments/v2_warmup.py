r"""v2's curriculum warmup region for the whole run: one regime of the ANDREA curriculum, alone.

  python -m andrea_jax.curriculum --config experiments/v2_warmup.py --steps 20000 --out /tmp/sim

Only the seven warmup sources may have weight (hermes3-general, hermes3-creative, hermes3-roleplay,
chat, smoltalk, oasst, gutenberg): a 6-D sub-simplex; the nine others stay exactly at 0.
The command simulates the curriculum (no model) against the synthetic reward model, in a few seconds
on a laptop CPU.
Expect ``weights.png`` to show the seven warmup sources only, the nine others at 0 throughout.

As a training config it is ``andrea_jax.config.base_config()`` (the tiny model, 2000 steps) with the
curriculum restricted to this region:
``python -m andrea_jax.main --config=experiments/v2_warmup.py --workdir=runs/v2_warmup``.
"""

from andrea_jax import config as config_lib
from andrea_jax.curriculum import andrea_geometries, single_geometry


def get_config():
  c = config_lib.base_config()
  c.curriculum.geometries = single_geometry(andrea_geometries(), "v2_warmup")
  return c
