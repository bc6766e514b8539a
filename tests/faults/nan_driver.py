"""``python -m faults.nan_driver <main's flags>``: the training command with poisoned steps.

The batches of the steps listed in ``$ANDREA_FAULTS_NAN_STEPS`` (comma-separated) get one token id
far outside the embedding table, as corrupted data read without verification would give:
``nn.Embed`` returns NaN for it, so those steps' loss and gradient are NaN. Everything else is the
real command.
"""

import os

from andrea_jax import signals

if __name__ == "__main__":
  signals.hold()   # as the real command does, before the heavy imports

from andrea_jax.data import sampler as sampler_lib  # noqa: E402

NAN_STEPS = {int(s) for s in os.environ["ANDREA_FAULTS_NAN_STEPS"].split(",")}
_batch = sampler_lib.MixtureSampler.batch


def _poisoned_batch(self, step, weights):
  out = _batch(self, step, weights)
  if step in NAN_STEPS:
    out["inputs"][0, 0] = 1 << 30
  return out


if __name__ == "__main__":
  sampler_lib.MixtureSampler.batch = _poisoned_batch
  from andrea_jax import main
  main.run()
