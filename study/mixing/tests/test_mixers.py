"""The study's mixers, plugged into the package's curriculum by name."""

import math

import numpy as np

from andrea_jax import curriculum
from andrea_jax.sources import SOURCES
from tests.test_elastic import _drive, _full_simplex_config


def test_andrea_log_rate_steps_toward_the_fastest_source():
  """The study's ``andrea_log_rate`` mixer (by name), never random: each bandit phase moves ``eta`` of the way to the vertex of the
  source whose loss falls fastest in log-time (here extra-03), so its weight follows ``1 - (1 -
  eta)^k (1 - w_0)`` after ``k`` informed bandit phases."""
  c = _full_simplex_config(mixer=curriculum.mixer_config(
      "study.mixing.mixers:andrea_log_rate", eta=0.2, random_share=0.0, burn_in=20))
  spec = curriculum.spec_from_config(c)
  b = np.full(16, 0.1)
  top = SOURCES.index("extra-03")
  b[top] = 0.5
  used, state = _drive(spec, 400, lambda t: 4.0 - b * math.log1p(t))
  # Count the bandit phases decided once the rates were known (decided after step 20).
  starts = np.flatnonzero(np.r_[True, np.any(np.diff(used, axis=0) != 0, axis=1)])
  w_top = used[starts, top]
  # Before the burn-in every rate is unknown and the walk goes to random vertices; from the first
  # informed phase on, every phase steps toward extra-03's vertex.
  first = int(np.argmax(np.diff(w_top) > 0)) + 1
  informed, w0 = w_top[first:], w_top[first - 1]
  k = np.arange(1, len(informed) + 1)
  np.testing.assert_allclose(informed, 1 - 0.8 ** k * (1 - w0), rtol=1e-4)
  assert len(informed) >= 5 and starts[first] < 100
  # ANDREA's own walk ranks by the UCB index instead: a different walk on the same losses.
  c.mixer = curriculum.mixer_config("bandit_only", eta=0.2)
  used_ucb, _ = _drive(curriculum.spec_from_config(c), 400, lambda t: 4.0 - b * math.log1p(t))
  assert not np.allclose(used_ucb, used)
