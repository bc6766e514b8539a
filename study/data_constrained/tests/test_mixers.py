"""The DGA-style mixer's update, worked out by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax.curriculum import Decision, Observation
from study.data_constrained import mixers

NAN = float("nan")


def _obs(gains):
  n = len(gains)
  return Observation(step=jnp.int32(0), losses_S=jnp.zeros(n), tokens_S=jnp.ones(n),
                     weights_S=jnp.ones(n) / n, signals={"target_gain": jnp.array(gains)})


def _decision(current, upper):
  return Decision(key=jax.random.key(0), start=jnp.int32(10), lower_S=jnp.zeros(len(upper)),
                  upper_S=jnp.array(upper, jnp.float32),
                  current_S=jnp.array(current, jnp.float32), pivot=jnp.bool_(False))


@pytest.mark.parametrize("jit", [False, True])
def test_one_decision_by_hand(jit):
  m = mixers.dga()
  weights_and_state = lambda state, d: (lambda w, label, s: (w, s))(*m.decide(state, d))
  observe, decide = ((jax.jit(m.observe), jax.jit(weights_and_state)) if jit
                     else (m.observe, weights_and_state))
  state = observe(m.init(3), _obs([2.0, -1.0, NAN]))
  state = observe(state, _obs([4.0, NAN, NAN]))
  label = m.decide(state, _decision([1 / 3] * 3, [1, 1, 1]))[1]   # a name, outside the trace
  w, state = decide(state, _decision([1 / 3] * 3, [1, 1, 1]))
  # Window means a = (3, -1, unmeasured); median |a| over the measured = 2; z = (1.5, -0.5, 0).
  e = [math.exp(1.5), math.exp(-0.5), 1.0]
  p = [x / sum(e) for x in e]
  want = [0.95 * (0.7 / 3 + 0.3 * x) + 0.05 / 3 for x in p]
  np.testing.assert_allclose(w, want, rtol=1e-6)
  assert label == "dga" and math.isclose(float(jnp.sum(w)), 1.0, rel_tol=1e-6)
  np.testing.assert_allclose(state.logits_S, [1.5, -0.5, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(state.gain_count_S, 0)    # the window is closed
  # The next decision, nothing measured: z as it was, w moves toward softmax(z) again.
  w2, state2 = decide(state, _decision(w, [1, 1, 1]))
  np.testing.assert_allclose(state2.logits_S, state.logits_S)
  want2 = [0.95 * (0.7 * a + 0.3 * b) + 0.05 / 3 for a, b in zip(want, p)]
  np.testing.assert_allclose(w2, want2, rtol=1e-6)


def test_sources_outside_the_region_are_ignored():
  m = mixers.dga()
  state = m.observe(m.init(3), _obs([1.0, 3.0, 100.0]))
  w, _, state = m.decide(state, _decision([0.5, 0.5, 0.0], [1, 1, 0]))
  # a = (1, 3) on the region; median |a| = 2; z = (0.5, 1.5); the third source's gain unread.
  p0 = 1 / (1 + math.e)
  want = [0.95 * (0.35 + 0.3 * p0) + 0.025, 0.95 * (0.35 + 0.3 * (1 - p0)) + 0.025, 0.0]
  np.testing.assert_allclose(w, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(state.logits_S[:2], [0.5, 1.5], rtol=1e-6)
  assert float(state.logits_S[2]) == 0.0


def test_all_zero_gains_change_nothing_but_the_smoothing():
  m = mixers.dga(step=0.5, floor=0.0)
  state = m.observe(m.init(2), _obs([0.0, 0.0]))
  w, _, state = m.decide(state, _decision([0.8, 0.2], [1, 1]))
  np.testing.assert_allclose(w, [0.65, 0.35], rtol=1e-6)     # half way to softmax(0) = uniform
  np.testing.assert_array_equal(state.logits_S, 0.0)


def test_the_mixer_names_its_signal_and_checks_its_arguments():
  assert mixers.dga().signals == ("target_gain",) and mixers.dga().labels == ("dga",)
  with pytest.raises(ValueError, match="step must be"):
    mixers.dga(step=1.5)
