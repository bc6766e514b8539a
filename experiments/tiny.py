r"""The main job: a tiny ANDREA on real text, the curriculum's three geometries scaled down.

  make demo                       # = python -m andrea_jax.main --config=experiments/tiny.py --workdir=runs/tiny
  python -m andrea_jax.main --config=experiments/tiny.py --workdir=runs/tiny --config.train.stop_step=200

The data is the ``stdlib`` built-in corpus (:mod:`andrea_jax.data.corpora.stdlib`): six sources cut
from the Python standard library of the interpreter that runs it, built in seconds, no download:
``python-code``, ``docstrings``, ``reference`` (the language reference), ``notes``, ``licenses``
and ``noisy-docstrings`` (a corrupted copy of the docstrings). The curriculum is ANDREA's, over
these sources, at ANDREA's fractions of the run (``andrea_jax.curriculum.three_regimes``):

* ``v2_warmup`` (the first 10%): only the clean English about Python (docstrings, reference,
  notes), as ANDREA's warmup kept to its conversational sources;
* ``v2_firehose`` (to 56%): all six sources;
* ``v3_polish`` (the rest): ``docstrings >= 0.5`` (a floor on a target source), ``licenses`` (the
  memorisable boilerplate, this corpus's ``repo-docs``) and ``noisy-docstrings`` excluded.

The evaluation reports each source's held-out loss in nats per token and bits per byte, the loss on
the corpus's declared target (docstrings, reference and notes, equally: ``eval/target_loss``), and
the share of the sampled words that are words of the corpus (``eval/word_share``).

(``train.stop_step`` ends the run early with the schedules still laid out over the 1000 steps;
``train.num_steps`` changes the length but not the geometries' start steps, 100 and 563: set
``curriculum.geometries.<name>.start_step`` with it, or the run warns that a geometry never starts.)

Hardware: sized for a 2-core laptop CPU (minutes); runs unchanged on a GPU in seconds. Expect the
held-out mean loss to fall from ln(257) = 5.55 nats/byte (8 bits/byte) to under 2.5 bits/byte, the
samples to read as Python after a code prompt and as English after "The ", and the share of their
words that are words of the corpus to rise. Re-running the command resumes from the last
checkpoint.

One regime of the curriculum alone, for the whole run (the same model and optimizer):

  python -m andrea_jax.main --config=experiments/tiny.py:v3_polish --workdir=runs/v3_polish
  python -m andrea_jax.curriculum --config experiments/tiny.py:v2_warmup --steps 20000 --out /tmp/sim

(the second command simulates the curriculum alone, no model, against a synthetic reward model in a
few seconds; expect ``weights.png`` to show the region's constraints at every step).
``experiments/synthetic.py`` is the same job on ANDREA's sixteen source names (synthetic text).
"""

from andrea_jax import config as config_lib
from andrea_jax.curriculum import single_geometry, three_regimes
from andrea_jax.data.corpora.stdlib import STDLIB_SOURCES, STDLIB_TARGET
from andrea_jax.sources import source_key

NUM_STEPS = 1000
SCALE = NUM_STEPS / 200_000   # the ANDREA run is 200K steps; every step count below is scaled by this


def get_config(geometry: str | None = None):
  """The main job, or with ``geometry`` one region of its curriculum for the whole run.

  ``geometry``: ``v2_warmup``, ``v2_firehose`` or ``v3_polish``, that region from step 0 to the end
  instead of the three in turn.
  """
  c = config_lib.base_config(sources=STDLIB_SOURCES, corpus="stdlib")
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

  c.curriculum.geometries = three_regimes(
      NUM_STEPS, sources=STDLIB_SOURCES, warmup=("docstrings", "reference", "notes"),
      floors={"docstrings": 0.5}, exclude=("licenses", "noisy-docstrings"),
      names=("v2_warmup", "v2_firehose", "v3_polish"))
  if geometry:
    c.curriculum.geometries = single_geometry(c.curriculum.geometries, geometry)

  for name, weight in STDLIB_TARGET.items():   # the corpus's declared target
    c.eval.target[source_key(name)] = weight
  c.eval.prompts = ("import os\n\ndef ", "The ", "Return the ")

  # The zombie-cliff detector watches the run; its window and warmup are scaled to the run's length.
  c.cliff.window = 100
  c.cliff.warmup = 200
  c.cliff.cooldown = 100
  return c
