r"""The ANDREA curriculum: the three regimes chained over the 200K-step run (the simulator's run).

  python -m andrea_jax.curriculum --config experiments/andrea_curriculum.py --out runs/sim_andrea

Simulates the curriculum alone (no model) for 200,000 steps against the synthetic reward model, in
a few seconds on a laptop CPU. Expect about 8,100 phases of 7 to 42 steps (a quarter random, the
rest bandit steps toward the UCB vertex); ``weights.png`` shows the seven warmup sources alone until
step 20,000, all sixteen sources until 112,619, then the polish region: repo-docs and
repo-docstrings at 0, hermes3-general at or above 0.7, dictionary at or under 0.25.

Every geometry field is a flag, e.g.
``--config.curriculum.geometries.v3_polish.floors.hermes3_general=0.6`` or
``--config.curriculum.geometries.v3_polish.start_step=100000``.
As a training config it keeps the tiny model of ``andrea_jax.config.base_config`` and runs 200K
steps:

  python -m andrea_jax.main --config=experiments/andrea_curriculum.py --workdir=runs/andrea
"""

from andrea_jax import config as config_lib
from andrea_jax.curriculum import andrea_geometries

NUM_STEPS = 200_000


def get_config():
  c = config_lib.base_config()
  c.train.num_steps = NUM_STEPS
  c.curriculum.geometries = andrea_geometries(NUM_STEPS)
  return c
