r"""The main job: a tiny ANDREA on the built-in 16-source corpus, the whole curriculum scaled down.

  make demo                       # = python -m andrea_jax.main --config=experiments/tiny.py --workdir=runs/tiny
  python -m andrea_jax.main --config=experiments/tiny.py --workdir=runs/tiny --config.train.stop_step=200

(``train.stop_step`` ends the run early with the schedules still laid out over the 1000 steps;
``train.num_steps`` changes the length but not the geometries' start steps, 100 and 563: set
``curriculum.geometries.<name>.start_step`` with it, or the run warns that a geometry never starts.)

Hardware: sized for a 2-core laptop CPU (a few minutes); runs unchanged on a GPU in seconds.
Expect: the held-out mean loss falls from ln(257) = 5.55 nats/byte to well under 2; the mixture starts
on the seven warmup sources, opens to all sixteen at 1/10 of the run and pivots to the polish region
(repo-docs and repo-docstrings at 0, hermes3-general >= 0.7, dictionary <= 0.25) at 56% of the run, as
the 200K-step run does at 20K and 112,619. Re-running the command resumes from the last checkpoint.

One regime of the curriculum alone, for the whole run (the same model and optimizer):

  python -m andrea_jax.main --config=experiments/tiny.py:v3_polish --workdir=runs/v3_polish
  python -m andrea_jax.curriculum --config experiments/tiny.py:v2_warmup --steps 20000 --out /tmp/sim

* ``v2_warmup``: only the seven warmup sources (hermes3-general, hermes3-creative, hermes3-roleplay,
  chat, smoltalk, oasst, gutenberg) may have weight, a 6-D sub-simplex; the nine others stay at 0.
* ``v2_firehose``: all sixteen sources, no floor, no ceiling: the full 15-D simplex.
* ``v3_polish``: repo-docs and repo-docstrings excluded, hermes3-general >= 0.7, dictionary <= 0.25.

The second command simulates the curriculum (no model) against the synthetic reward model in a few
seconds; expect ``weights.png`` to show the region's constraints at every step.
"""

from andrea_jax import config as config_lib
from andrea_jax.curriculum import andrea_geometries, single_geometry

NUM_STEPS = 1000
SCALE = NUM_STEPS / 200_000   # the ANDREA run is 200K steps; every step count below is scaled by this


def get_config(geometry: str | None = None):
  """The main job, or with ``geometry`` one region of its curriculum for the whole run.

  ``geometry``: ``v2_warmup``, ``v2_firehose`` or ``v3_polish``, that region from step 0 to the end
  instead of the three in turn.
  """
  c = config_lib.base_config()
  c.train.num_steps = NUM_STEPS
  c.train.log_every = 10
  c.train.checkpoint_every = 250
  c.eval.every = 250

  # A byte-level 4-layer decoder: 0.9M parameters, trains at ~5-10K tokens/s on 2 CPU cores.
  c.model.max_len = 128
  c.data.seq_len = 128
  c.data.global_batch_size = 32     # sequences per step; 32 rows give the mixture a 1/32 resolution

  # Small models tolerate (and need) a larger peak rate than ANDREA-120M's 3e-4; the warmup keeps v2's
  # proportion of the run (2000 / 200K = 1%), floored at 20 steps so that it stays a ramp.
  c.optim.peak_lr = 2e-3
  c.optim.warmup_steps = max(20, round(2000 * SCALE))
  c.optim.weight_decay = 0.1

  c.curriculum.geometries = andrea_geometries(NUM_STEPS, scale=SCALE)
  if geometry:
    c.curriculum.geometries = single_geometry(c.curriculum.geometries, geometry)

  # The zombie-cliff detector watches the run; its window and warmup are scaled to the run's length.
  c.cliff.window = 100
  c.cliff.warmup = 200
  c.cliff.cooldown = 100
  return c
